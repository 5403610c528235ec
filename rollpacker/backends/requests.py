"""What every rollout engine checks of the requests it is given, and which of their ids it holds.

`RequestIds` is shared by the embedded and the SGLang engines: `check` refuses a batch with a request
that is not a `GenerationRequest`, an empty or non-string id, an empty prompt, or an id already
running (in flight or twice in the batch), before anything is queued; `check_known` refuses an abort
of an id never submitted.  An engine adds its own checks on top (the embedded one: the vocabulary
and the model's context).  Not thread-safe: each engine guards it with its own lock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rollpacker.backends.errors import BackendMisuse
from rollpacker.core.errors import ConfigError
from rollpacker.core.protocols import GenerationRequest


class UnknownRequest(BackendMisuse):
    """abort() named a request id this engine never received."""


class RequestIds:
    """The ids of one engine's requests: `live` (submitted, result not yet emitted) and every one
    ever submitted (an abort of one that finished already is a normal race, not an error)."""

    def __init__(self) -> None:
        self.live: set[str] = set()
        self._seen: set[str] = set()

    def __len__(self) -> int:
        return len(self.live)

    def check(self, requests: Sequence[GenerationRequest]) -> None:
        """Raise on the first request that is malformed or whose id is already running."""
        batch: set[str] = set()
        for r in requests:
            check_request(r)
            if r.request_id in self.live or r.request_id in batch:
                raise BackendMisuse(f"request {r.request_id!r}: this id is already running (duplicate request_id)")
            batch.add(r.request_id)

    def add(self, requests: Iterable[GenerationRequest]) -> None:
        """These requests are in flight now (after `check`)."""
        for r in requests:
            self.live.add(r.request_id)
            self._seen.add(r.request_id)

    def done(self, request_id: str) -> None:
        """Its result is out: no longer in flight."""
        self.live.discard(request_id)

    def check_known(self, request_ids: Iterable[str]) -> None:
        """Raise `UnknownRequest` if one of these ids was never submitted."""
        unknown = [r for r in request_ids if r not in self._seen]
        if unknown:
            raise UnknownRequest(f"abort: unknown request id(s) {unknown[:5]!r}")


def check_request(r: object) -> None:
    """The checks every engine makes of one request: its type, its id and a non-empty prompt."""
    if not isinstance(r, GenerationRequest):
        raise ConfigError(f"submit expects GenerationRequest, got {type(r).__name__}")
    if not isinstance(r.request_id, str) or not r.request_id:
        raise ConfigError(f"request_id must be a non-empty string, got {r.request_id!r}")
    if not r.prompt_ids:
        raise ConfigError(f"request {r.request_id!r}: prompt_ids is empty")
