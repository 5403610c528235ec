"""The body of SGLang's POST /generate, as `rollpacker serve` reads it: token ids in, one
`GenerationRequest` out; a sampling param this server would not honour is a `BadRequest` naming the
field (400), never ignored."""

from __future__ import annotations

import uuid
from typing import Any

from rollpacker.core.protocols import GenerationRequest


class BadRequest(ValueError):
    """A request the server refuses (400), naming the field."""


HONOURED_PARAMS = ("max_new_tokens", "temperature", "top_p", "top_k", "sampling_seed", "stop", "stop_token_ids",
                   "ignore_eos", "skip_special_tokens", "no_stop_trim")
OFF_VALUES = {
    "min_new_tokens": 0, "repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
    "min_p": 0.0, "n": 1, "stop_regex": None, "json_schema": None, "regex": None, "ebnf": None,
    "structural_tag": None, "logit_bias": None, "custom_params": None, "stream_interval": None,
    "spaces_between_special_tokens": True,
}
"""SGLang's other sampling params: accepted only at the value that turns them off (or null)."""
HINTS = {"n": ": send one request per sample with its own rid"}


def check_params(params: dict) -> None:
    """Refuse (400, naming the field) any sampling param this server would not honour."""
    for name, value in params.items():
        if name == "ignore_eos":
            if not isinstance(value, bool):
                raise BadRequest(f"sampling_params.ignore_eos must be true or false, got {value!r}")
        elif name in OFF_VALUES:
            off = OFF_VALUES[name]
            if not (value is None or value == off or (off is None and not value)):
                raise BadRequest(f"sampling_params.{name}={value!r} is not supported by rollpacker serve "
                                  f"(only {off!r}, off){HINTS.get(name, '')}")
        elif name not in HONOURED_PARAMS:
            raise BadRequest(f"sampling_params.{name} is not a sampling parameter rollpacker serve knows "
                              f"(it honours {', '.join(HONOURED_PARAMS)})")


def stop_params(params: dict) -> tuple[tuple[str, ...], tuple[int, ...], int | None]:
    """(stop strings, stop token ids, top_k) of a request's sampling params."""
    stop = params.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else stop
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise BadRequest(f"sampling_params.stop must be a string or a list of non-empty strings, got {stop!r}")
    ids = params.get("stop_token_ids") or ()
    if not isinstance(ids, (list, tuple)) or not all(isinstance(t, int) and t >= 0 for t in ids):
        raise BadRequest(f"sampling_params.stop_token_ids must be a list of token ids, got {ids!r}")
    top_k = params.get("top_k")
    if top_k is not None and (not isinstance(top_k, int) or top_k == 0 or top_k < -1):
        raise BadRequest(f"sampling_params.top_k must be -1 (off) or an integer >= 1, got {top_k!r}")
    return tuple(stop), tuple(ids), None if top_k in (None, -1) else top_k


def request_from_body(body: Any) -> tuple[GenerationRequest, dict]:
    """A /generate body -> (one GenerationRequest, its sampling params); anything unsupported is a
    `BadRequest` naming the field."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    if "input_ids" not in body:
        raise BadRequest("input_ids is required: this server does not tokenize (send token ids, not text)")
    ids = body["input_ids"]
    if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and t >= 0 for t in ids):
        raise BadRequest("input_ids must be one non-empty list of token ids (batches are not supported)")
    rid = body.get("rid")
    if rid is None:
        rid = uuid.uuid4().hex
    if not isinstance(rid, str) or not rid:
        raise BadRequest(f"rid must be one non-empty string, got {rid!r}")
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise BadRequest("sampling_params must be an object")
    check_params(params)
    stop, stop_ids, top_k = stop_params(params)
    try:
        gen = GenerationRequest(
            request_id=rid,
            prompt_ids=tuple(ids),
            max_new_tokens=int(params.get("max_new_tokens", 128)),
            temperature=float(params.get("temperature", 1.0)),
            top_p=float(params.get("top_p", 1.0)),
            seed=None if params.get("sampling_seed") is None else int(params["sampling_seed"]),
            top_k=top_k, stop_token_ids=stop_ids, stop=stop, ignore_eos=params.get("ignore_eos", False),
        )
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"bad sampling_params: {exc}") from None
    return gen, params
