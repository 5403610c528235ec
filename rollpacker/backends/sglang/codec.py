"""SGLang's native /generate wire format <-> rollpacker's generation records, both directions.

The client (`client.py`) turns a `GenerationRequest` into a /generate body and folds the streamed
chunks into a `GenerationResult`; the server (`server.py`) turns an engine's results into the same
chunks.  The wire format lives only here.

Request (one sample per request, never `n > 1`: SGLang would replace our rids):

    {"rid": "rp000000000042", "input_ids": [...], "stream": true, "return_logprob": true,
     "sampling_params": {"max_new_tokens": 256, "temperature": 1.0, "top_p": 1.0,
                         "sampling_seed": 7}}      (+ top_k, stop_token_ids, stop, ignore_eos when set)

Streamed response: server-sent events `data: {json}\\n\\n`, ending with `data: [DONE]\\n\\n`.  Each
chunk is `{"output_ids": [...], "meta_info": {...}}` (plus "text" when the server detokenizes).
meta_info holds `completion_tokens` (a running count), `finish_reason` (None while running, else
{"type": "stop"|"length"|"abort", ...}), and with return_logprob `output_token_logprobs`
([[logprob, token_id, text_or_null], ...]).  SGLang sends `output_ids` and the log-probs either
cumulative (its default) or as deltas (`--incremental-streaming-output`); `StreamState` accepts
both: a list as long as the running count is the whole list, one that extends what we hold to the
count is a delta, anything else is a count-only chunk (rollpacker serve sends those: its engine
reports progress as counts) and leaves the ids alone.  The final chunk must account for every token.
An error inside a stream arrives as a chunk `{"error": {"message": ...}}`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from attrs import define, field

from rollpacker.backends.errors import BackendProtocolError, ServerRejected
from rollpacker.core.protocols import GenerationProgress, GenerationRequest, GenerationResult

SSE_PREFIX = b"data: "
SSE_DONE = b"[DONE]"


# -- client side: request body, stream folding ----------------------------------------------------


def generate_body(request: GenerationRequest, *, stream: bool = True) -> dict[str, Any]:
    """The /generate body of one sample: prompt + resumed prefix as input ids."""
    sampling: dict[str, Any] = {
        "max_new_tokens": request.max_new_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
    }
    if request.seed is not None:
        sampling["sampling_seed"] = request.seed
    if request.top_k is not None:
        sampling["top_k"] = request.top_k
    if request.stop_token_ids:
        sampling["stop_token_ids"] = list(request.stop_token_ids)
    if request.stop:
        sampling["stop"] = list(request.stop)
    if request.ignore_eos:
        sampling["ignore_eos"] = True
    return {
        "rid": request.request_id,
        "input_ids": list(request.prompt_ids) + list(request.resume_ids),
        "sampling_params": sampling,
        "stream": stream,
        "return_logprob": True,
    }


def parse_sse_line(line: bytes, server: str) -> dict | None:
    """One line of an SSE stream: a chunk dict, or None for blank lines and `[DONE]`."""
    line = line.strip()
    if not line or line.startswith(b":"):
        return None
    if not line.startswith(SSE_PREFIX):
        raise BackendProtocolError(f"server {server}: /generate stream line is not SSE data: {line[:120]!r}")
    payload = line[len(SSE_PREFIX):].strip()
    if payload == SSE_DONE:
        return None
    try:
        chunk = json.loads(payload)
    except ValueError:
        raise BackendProtocolError(f"server {server}: /generate sent invalid JSON: {payload[:120]!r}") from None
    if not isinstance(chunk, dict):
        raise BackendProtocolError(f"server {server}: /generate chunk is not an object: {payload[:120]!r}")
    return chunk


@define
class StreamState:
    """What one streamed request has produced so far (see the module docstring for the rules)."""

    request_id: str
    server: str
    token_ids: list[int] = field(factory=list)
    logprobs: list[float] = field(factory=list)
    num_tokens: int = 0
    finish_reason: str | None = None
    weight_version: int | None = None
    way_back_s: float | None = None
    way_in_s: float | None = None
    sent_at: float | None = None
    """When the client sent the request (wall clock; set by the client)."""

    def apply(self, chunk: dict) -> None:
        """Fold one chunk in; a malformed chunk raises `BackendProtocolError` naming the server."""
        if "error" in chunk:
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else error
            raise ServerRejected(f"server {self.server}: /generate rid={self.request_id} failed: {message}")
        meta = chunk.get("meta_info")
        if not isinstance(meta, dict):
            raise self._bad("chunk has no meta_info object", chunk)
        count = meta.get("completion_tokens")
        if not isinstance(count, int) or count < 0:
            raise self._bad("meta_info.completion_tokens is missing or not a count", chunk)
        ids = chunk.get("output_ids")
        pairs = meta.get("output_token_logprobs")
        if ids is None and isinstance(pairs, list):  # a server that detokenizes may omit output_ids
            ids = [p[1] for p in pairs if isinstance(p, (list, tuple)) and len(p) >= 2]
        if ids is not None:
            self.token_ids = self._fold("output_ids", self.token_ids, ids, count, chunk)
        if pairs is not None:
            if not isinstance(pairs, list) or not all(isinstance(p, (list, tuple)) and p for p in pairs):
                raise self._bad("meta_info.output_token_logprobs is not a list of [logprob, id, text]", chunk)
            values = [float(p[0]) if p[0] is not None else math.nan for p in pairs]
            self.logprobs = self._fold("output_token_logprobs", self.logprobs, values, count, chunk)
        self.num_tokens = max(self.num_tokens, count)
        version = meta.get("weight_version")
        if version is not None:
            try:
                self.weight_version = int(version)
            except (TypeError, ValueError):
                pass  # a non-numeric label (SGLang's default "default"): keep the client's count
        reason = meta.get("finish_reason")
        if reason is not None:
            kind = reason.get("type") if isinstance(reason, dict) else reason
            if kind not in ("stop", "length", "abort"):
                raise self._bad(f"unknown finish_reason {reason!r}", chunk)
            self.finish_reason = kind
            self.way_back_s = way_back(meta, time.time())
            self.way_in_s = way_in(meta, self.sent_at)
            if len(self.token_ids) != count:
                raise self._bad(f"final chunk has {len(self.token_ids)} output_ids for {count} tokens", chunk)
            if len(self.logprobs) != count:
                raise self._bad(f"final chunk has {len(self.logprobs)} log-probs for {count} tokens", chunk)

    def _fold(self, name: str, held: list, new: list, count: int, chunk: dict) -> list:
        if not isinstance(new, list):
            raise self._bad(f"{name} is not a list", chunk)
        if name == "output_ids" and not all(isinstance(t, int) for t in new):
            raise self._bad("output_ids holds a non-integer", chunk)
        if len(new) == count:
            return list(new)  # cumulative (or the first delta, the same thing)
        if len(held) + len(new) == count:
            held.extend(new)  # incremental streaming output, in place: a copy per chunk is quadratic
        return held  # (or a count-only progress chunk)

    def _bad(self, what: str, chunk: dict) -> BackendProtocolError:
        text = json.dumps(chunk)[:200]
        return BackendProtocolError(f"server {self.server}: /generate rid={self.request_id}: {what}: {text}")

    def progress(self, at: float | None = None) -> GenerationProgress:
        return GenerationProgress(self.request_id, self.num_tokens, time.monotonic() if at is None else at)

    def result(self, reason: str | None, version: int, at: float | None = None) -> GenerationResult:
        """The result with `reason` (None: the server's), holding only tokens that came with log-probs."""
        n = min(len(self.token_ids), len(self.logprobs))
        return GenerationResult(
            request_id=self.request_id,
            token_ids=tuple(self.token_ids[:n]),
            logprobs=tuple(self.logprobs[:n]),
            finish_reason=reason or self.finish_reason or "abort",
            weight_version=self.weight_version if self.weight_version is not None else version,
            at=time.monotonic() if at is None else at,
            way_back_s=self.way_back_s,
            way_in_s=self.way_in_s,
        )


SERVER_TIMES = ("request_finished_ts", "prefill_finished_time", "response_sent_to_client_ts")
"""The final chunk's meta_info times (wall clock) SGLang sends with --enable-metrics that `way_back` reads."""


def way_back(meta: dict, now: float) -> float | None:
    """Seconds from the engine's end of a request to `now` (wall clock, the final chunk's arrival), from its final
    chunk's `meta` where the server sends its times (`SERVER_TIMES`; else None): its front end's finish to now,
    plus the hop from the scheduler to the front end as the request's first token took it (the scheduler's
    prefill finish to the first chunk's sending: SGLang reports no time of the last token's step)."""
    times = [meta.get(name) for name in SERVER_TIMES]
    if not all(isinstance(t, (int, float)) and t > 0 for t in times):
        return None
    finished, prefilled, first_sent = times
    return max(0.0, now - finished) + max(0.0, first_sent - prefilled)


def way_in(meta: dict, sent_at: float | None) -> float | None:
    """Seconds from the request's sending (`sent_at`, wall clock) to its entering the scheduler's waiting queue (its
    first forward less its wait there: `forward_entry_time` - `queue_time`), from its final chunk's `meta` where the
    server sends them (--enable-metrics; else None)."""
    entered, waited = meta.get("forward_entry_time"), meta.get("queue_time")
    if sent_at is None or not isinstance(entered, (int, float)) or entered <= 0 or not isinstance(waited, (int, float)):
        return None
    return max(0.0, entered - waited - sent_at)


# -- server side: engine records -> chunks ---------------------------------------------------------


def progress_chunk(rid: str, num_tokens: int, prompt_tokens: int, weight_version: str) -> dict[str, Any]:
    """A count-only chunk: the engine protocol reports progress as a count, not the ids."""
    return {
        "output_ids": [],
        "meta_info": {
            "id": rid,
            "finish_reason": None,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": num_tokens,
            "cached_tokens": 0,
            "weight_version": weight_version,
        },
    }


def stop_match(result: GenerationResult, stops: Sequence[str], *, decode: Callable[[list[int]], str],
               trim: bool = True) -> dict[str, Any]:
    """`{"text": ..., "matched": ...}` of a finished request as SGLang reports them: a "stop" matched
    the earliest of `stops` in the text (the text ends before it) or else its last token (left out of
    the text); `trim` False keeps the text whole."""
    text = decode(list(result.token_ids))
    if result.finish_reason != "stop" or not result.token_ids:
        return {"text": text}
    hits = sorted((text.find(s), s) for s in stops if s in text)
    if hits:
        at, matched = hits[0]
        return {"text": text[:at] if trim else text, "matched": matched}
    return {"text": decode(list(result.token_ids[:-1])) if trim else text, "matched": result.token_ids[-1]}


def result_chunk(result: GenerationResult, prompt_tokens: int, latency_s: float, max_new_tokens: int, *,
                 text: str | None = None, matched: int | str | None = None) -> dict:
    """The final chunk (and the non-stream answer) of a finished request, as SGLang shapes it; `text`
    and `matched` from `stop_match` when the server decodes (else no text, and a stop matched the
    last token)."""
    if result.finish_reason == "stop":
        if matched is None and result.token_ids:
            matched = result.token_ids[-1]
        reason: dict[str, Any] = {"type": "stop", "matched": matched}
    elif result.finish_reason == "length":
        reason = {"type": "length", "length": max_new_tokens}
    else:
        reason = {"type": "abort", "message": "Abort in waiting queue or running batch."}
    chunk: dict[str, Any] = {} if text is None else {"text": text}
    return chunk | {
        "output_ids": list(result.token_ids),
        "meta_info": {
            "id": result.request_id,
            "finish_reason": reason,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(result.token_ids),
            "cached_tokens": 0,
            "output_token_logprobs": [[lp, tok, None] for lp, tok in zip(result.logprobs, result.token_ids)],
            "weight_version": str(result.weight_version),
            "e2e_latency": latency_s,
        },
    }


def sse(chunk: dict | None) -> bytes:
    """One server-sent event; None gives the closing `[DONE]`."""
    return SSE_PREFIX + (SSE_DONE if chunk is None else json.dumps(chunk).encode()) + b"\n\n"
