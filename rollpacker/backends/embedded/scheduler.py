"""The embedded engine's scheduler: which requests wait, which run in which KV cache slot, which are
admitted next, and what a finish or an abort frees.  No torch here (the nano-vllm split): the runner
owns the cache and moves a slot's contents where `compact` says; `batch.RunningBatch` does the
torch work (prefill, decode, sampling) and drives this.

Theory of operation
    A row is WAITING in `waiting` (first come, first admitted), then RUNNING in `running`, where
    row i lives in KV cache slot i, then FINISHED (a stop, its length or an abort).  A finished row
    keeps its slot until `compact`, which moves the last row into each freed slot, so the running
    rows always fill slots 0..n-1.  `admit` takes waiting rows into the slots after the running
    ones, within the free slots and the prefill token budget, and holds them back while rows run
    and fewer than `admit_fraction` of their count could join (a prefill is batched: admitting one
    row per step would prefill once per step).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Iterable

from attrs import define, field, frozen

from rollpacker.core.errors import ConfigError
from rollpacker.core.protocols import GenerationRequest

MAX_PREFILL_TOKENS = 8192
"""Prompt tokens admitted in one prefill (at least one request): the engine's default."""


class RowStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@define(eq=False)
class Row:
    request: GenerationRequest
    tokens: list[int]
    """Prompt (+ resumed prefix) then the generated tokens; the cache holds all but the last."""
    num_prompt: int
    max_new: int
    seed: int
    version: int = -1
    logprobs: list[float] = field(factory=list)
    status: RowStatus = RowStatus.WAITING
    num_reported: int = 0

    @classmethod
    def checked(cls, r: GenerationRequest, *, vocab_size: int, context_len: int, has_tokenizer: bool,
                draw_seed: Callable[[], int]) -> Row:
        """The row of `r` once its token ids, stop strings and length fit the engine (a ConfigError naming
        the request if not); a sampled request without a seed gets `draw_seed()`."""
        rid, prompt = r.request_id, list(r.prompt_ids) + list(r.resume_ids)
        for what, ids in (("token ids", prompt), ("stop_token_ids", r.stop_token_ids)):
            bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < vocab_size]
            if bad:
                raise ConfigError(f"request {rid!r}: {what} {bad[:5]} outside the vocabulary [0, {vocab_size})")
        if r.stop and (not has_tokenizer or not all(isinstance(s, str) and s for s in r.stop)):
            raise ConfigError(f"request {rid!r}: stop strings must be non-empty strings, and need the engine "
                              f"to have a tokenizer (it has {'one' if has_tokenizer else 'none'}): {r.stop!r}")
        if len(prompt) >= context_len:
            raise ConfigError(f"request {rid!r}: prompt (+ resume) has {len(prompt)} tokens; the model's context "
                              f"is {context_len} tokens, leaving no room to generate")
        seed = (r.seed if r.seed is not None else draw_seed()) if r.temperature > 0 else 0
        return cls(r, prompt, len(prompt), min(r.max_new_tokens, context_len - len(prompt)), int(seed))

    @property
    def rid(self) -> str:
        return self.request.request_id

    @property
    def is_finished(self) -> bool:
        return self.status is RowStatus.FINISHED

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - self.num_prompt

    @property
    def token_ids(self) -> list[int]:
        return self.tokens[self.num_prompt :]

    @property
    def cache_len(self) -> int:
        return len(self.tokens) - 1


@frozen
class Admission:
    """Rows now running in slots `first_slot`, `first_slot + 1`, ...: prefill them there."""

    first_slot: int
    rows: list[Row]


@frozen
class Move:
    """Move the first `cache_len` cached tokens of slot `src` into slot `dst`."""

    src: int
    dst: int
    cache_len: int


class RowScheduler:
    """The waiting queue and the running rows of one engine (see the module's docstring)."""

    def __init__(self, *, capacity: int, admit_fraction: float, max_prefill_tokens: int) -> None:
        self.capacity = capacity
        self.admit_fraction = admit_fraction
        self.max_prefill_tokens = max_prefill_tokens
        self.waiting: deque[Row] = deque()
        self.running: list[Row] = []  # Invariant: running[i] lives in cache slot i; finished rows leave at compact

    @property
    def preemptions(self) -> int:
        """Running rows put back to wait for memory: always 0 here.  A row's whole KV length (its
        prompt plus its most new tokens) is reserved when it is admitted, so a running row never
        runs out of cache and nothing is preempted.  Reported so a caller can report it the same
        way for every engine."""
        return 0

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, rows: Iterable[Row]) -> None:
        for row in rows:
            if row.status is not RowStatus.WAITING:
                raise RuntimeError(f"request {row.rid!r}: added while {row.status.value} (engine bug)")
            self.waiting.append(row)

    def admit(self) -> Admission | None:
        """Move the waiting rows that may start now into the free slots after the running ones."""
        num_live = len(self.running)
        admit = self._pick(self.capacity - num_live)
        if not admit:
            return None
        if num_live and len(admit) < max(1, int(self.admit_fraction * num_live)) and self.waiting:
            self.waiting.extendleft(reversed(admit))  # too few to be worth a prefill: wait for more
            return None
        for row in admit:
            row.status = RowStatus.RUNNING
        self.running.extend(admit)
        return Admission(num_live, admit)

    def _pick(self, num_free: int) -> list[Row]:
        """The waiting rows at the front that fit `num_free` slots and the prefill token budget
        (the first one always fits the budget)."""
        admit, budget = [], self.max_prefill_tokens
        while self.waiting and len(admit) < num_free:
            size = len(self.waiting[0].tokens)
            if admit and size > budget:
                break
            budget -= size
            admit.append(self.waiting.popleft())
        return admit

    def finish(self, row: Row) -> None:
        """A running row ended (a stop or its length); it keeps its slot until `compact`."""
        if row.status is not RowStatus.RUNNING:
            raise RuntimeError(f"request {row.rid!r}: finished while {row.status.value} (engine bug)")
        row.status = RowStatus.FINISHED

    def abort(self, request_ids: Iterable[str]) -> list[Row]:
        """Finish the unfinished rows with these ids (an id that finished already is skipped: a
        normal race); the waiting ones leave the queue now.  Returns them, each once."""
        ids = set(request_ids)
        aborted = [r for r in self.running if not r.is_finished and r.rid in ids]
        aborted += [r for r in self.waiting if r.rid in ids]
        self.waiting = deque(r for r in self.waiting if r.rid not in ids)
        for row in aborted:
            row.status = RowStatus.FINISHED
        return aborted

    def abort_all(self) -> list[Row]:
        """Finish every unfinished row and empty the queue and the slots; returns them, each once."""
        aborted = [r for r in self.running if not r.is_finished] + list(self.waiting)
        for row in aborted:
            row.status = RowStatus.FINISHED
        self.running, self.waiting = [], deque()
        return aborted

    def compact(self) -> list[Move]:
        """Take the finished rows out of their slots: the last running row moves into each freed
        slot.  Returns the moves for the runner's cache, to apply in order."""
        rows, moves = self.running, []
        for i in range(len(rows) - 1, -1, -1):
            if not rows[i].is_finished:
                continue
            last = rows.pop()  # every row after i is unfinished (checked already): `last` is one, or rows[i]
            if i < len(rows):
                moves.append(Move(len(rows), i, last.cache_len))
                rows[i] = last
        return moves
