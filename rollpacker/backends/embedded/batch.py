"""The running batch of the embedded engine: rows in KV cache slots (row i in slot i), the waiting
queue, and one step over them (admit and prefill, decode or verify drafts, sample, emit, compact).
No threads here: `embedded.EmbeddedEngine` owns the loop and the request bookkeeping."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable

import torch
from attrs import define, field

from rollpacker.backends.embedded.runner import Runner
from rollpacker.backends.embedded.sampling import sample, verify
from rollpacker.backends.embedded.speculation import Speculator
from rollpacker.core.protocols import GenerationRequest


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
    is_done: bool = False
    num_reported: int = 0

    @property
    def rid(self) -> str:
        return self.request.request_id

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - self.num_prompt

    @property
    def token_ids(self) -> list[int]:
        return self.tokens[self.num_prompt :]

    @property
    def cache_len(self) -> int:
        return len(self.tokens) - 1


class RunningBatch:
    """Rows decoding in the runner's slots and requests waiting for one.  `on_progress(row, now)`
    and `on_finish(row, reason, now)` report to the engine."""

    def __init__(self, runner: Runner, speculator: Speculator, *, capacity: int, admit_fraction: float,
                 max_prefill_tokens: int, stop_token_ids: frozenset[int], progress_every: int,
                 on_progress: Callable[[Row, float], None], on_finish: Callable[[Row, str, float], None],
                 detokenize: Callable[[list[int]], str] | None = None) -> None:
        self._runner = runner
        self._speculator = speculator
        self._capacity = capacity
        self._admit_fraction = admit_fraction
        self._max_prefill_tokens = max_prefill_tokens
        self._stop_token_ids = stop_token_ids
        self._progress_every = progress_every
        self._on_progress = on_progress
        self._on_finish = on_finish
        self._detokenize = detokenize  # token ids -> text, for requests with stop strings
        self.waiting: deque[Row] = deque()
        self.rows: list[Row] = []  # Invariant: row i lives in cache slot i; finished rows leave at the next compact
        self.version = 0  # weight version given to rows admitted from now on

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.rows)

    def abort(self, request_ids: Iterable[str]) -> None:
        ids = set(request_ids)
        for row in self.rows:
            if not row.is_done and row.rid in ids:
                self._finish(row, "abort")
        kept = deque()
        for row in self.waiting:
            if row.rid in ids:
                self._finish(row, "abort")
            else:
                kept.append(row)
        self.waiting = kept

    def abort_all(self) -> None:
        for row in list(self.rows) + list(self.waiting):
            if not row.is_done:
                self._finish(row, "abort")
        self.rows, self.waiting = [], deque()

    def _finish(self, row: Row, reason: str, now: float | None = None) -> None:
        row.is_done = True
        self._speculator.release(row.rid)
        self._on_finish(row, reason, time.monotonic() if now is None else now)

    def step(self) -> None:
        self._compact()
        self._admit()
        if not self.rows:
            if not self.waiting and not self._runner.is_cuda:
                self._runner.release()  # idle: give the KV cache's memory back to the trainer
            return
        rows = self.rows
        drafts = self._speculator.drafts([(r.rid, r.max_new - r.num_generated) for r in rows])
        params = self._sampling_params(rows)
        cache_lens = [r.cache_len for r in rows]
        if drafts is None:
            ids = torch.tensor([[r.tokens[-1]] for r in rows], dtype=torch.long)
            logits = self._runner.decode(ids, cache_lens)[:, 0]
            tokens, logprobs = sample(logits, *params)
            emitted = [[t] for t in tokens.tolist()]
            emitted_lp = [[lp] for lp in logprobs.tolist()]
        else:
            emitted, emitted_lp = self._verify(rows, drafts, cache_lens, params)
        now = time.monotonic()
        for row, toks, lps in zip(rows, emitted, emitted_lp):
            for tok, lp in zip(toks, lps):
                if self._append(row, tok, lp, now):
                    break
        self._compact()

    def _verify(self, rows, drafts, cache_lens, params):
        """One forward over each row's last token and its drafts; the emitted tokens per row."""
        k = max(len(d) for d in drafts)  # the forward is only as wide as the longest draft
        pad = self._runner.pad_token_id
        ids = torch.tensor([[r.tokens[-1], *d, *[pad] * (k - len(d))] for r, d in zip(rows, drafts)],
                           dtype=torch.long)
        num_drafts = [len(d) for d in drafts]
        logits = self._runner.decode(ids, cache_lens)
        device = logits.device
        tokens, logprobs, accepted = verify(
            logits, ids[:, 1:].to(device), torch.tensor(num_drafts, device=device), *params)
        accepted = accepted.tolist()
        self._speculator.record(num_drafts, accepted)
        tokens, logprobs = tokens.tolist(), logprobs.tolist()
        return ([t[: a + 1] for t, a in zip(tokens, accepted)],
                [lp[: a + 1] for lp, a in zip(logprobs, accepted)])

    def _sampling_params(self, rows: list[Row]) -> tuple[torch.Tensor, ...]:
        """(temperature, top_p, seed, counter, top_k) per row, on the model's device; top_p / top_k
        is None when no row cuts (saves sorting the vocabulary)."""
        device = self._runner.device
        top_p = [r.request.top_p for r in rows]
        top_k = [r.request.top_k or 1 << 62 for r in rows]
        return (
            torch.tensor([r.request.temperature for r in rows], dtype=torch.float32, device=device),
            torch.tensor(top_p, dtype=torch.float32, device=device) if min(top_p) < 1.0 else None,
            torch.tensor([r.seed for r in rows], dtype=torch.long, device=device),
            torch.tensor([r.num_generated for r in rows], dtype=torch.long, device=device),
            torch.tensor(top_k, dtype=torch.long, device=device) if any(r.request.top_k for r in rows) else None,
        )

    def _compact(self) -> None:
        """Take finished rows out of the batch: the last row moves into each freed slot."""
        rows = self.rows
        for i in range(len(rows) - 1, -1, -1):
            if not rows[i].is_done:
                continue
            last = rows.pop()
            if i < len(rows):
                self._runner.move(len(rows), i, last.cache_len)
                rows[i] = last

    def _admit(self) -> None:
        """Prefill waiting requests into the free slots, batched (see `admit_fraction`)."""
        num_live = len(self.rows)
        admit = self._pick_admissions(self._capacity - num_live)
        if not admit:
            return
        if num_live and len(admit) < max(1, int(self._admit_fraction * num_live)) and self.waiting:
            self.waiting.extendleft(reversed(admit))
            return
        for row in admit:
            row.version = self.version
            self._speculator.track(row.rid, row.request.group or row.rid, row.tokens, row.num_prompt)
        logits = self._runner.prefill(num_live, [r.tokens for r in admit])
        self.rows.extend(admit)
        tokens, logprobs = sample(logits, *self._sampling_params(admit))
        now = time.monotonic()
        for row, tok, lp in zip(admit, tokens.tolist(), logprobs.tolist()):
            self._append(row, tok, lp, now)
        # a row that its first token already ended (max_new_tokens 1, a stop token) leaves now,
        # before this step's decode would give it a token past its end (and a second result)
        self._compact()

    def _stop_string(self, row: Row) -> bool:
        """Whether the response's text now holds one of the request's stop strings.  Only its tail
        is decoded: one token more than the longest string has bytes (a token decodes to >= 1 byte)."""
        stops = row.request.stop
        if not stops:
            return False
        window = max(len(s.encode()) for s in stops) + 1
        tail = self._detokenize(row.token_ids[-window:])
        return any(s in tail for s in stops)

    def _pick_admissions(self, free: int) -> list[Row]:
        admit, budget = [], self._max_prefill_tokens
        while self.waiting and len(admit) < free:
            size = len(self.waiting[0].tokens)
            if admit and size > budget:
                break
            budget -= size
            admit.append(self.waiting.popleft())
        return admit

    def _append(self, row: Row, token: int, logprob: float, now: float) -> bool:
        """Record one generated token; finish the row on a stop token or its length.  True if done."""
        if row.is_done:  # a finished row left the batch at the last compact: never decode it again
            raise RuntimeError(f"request {row.rid!r}: a token after the request finished (engine bug)")
        row.tokens.append(token)
        row.logprobs.append(logprob)
        n = row.num_generated
        if token in self._stop_token_ids or token in row.request.stop_token_ids or self._stop_string(row):
            self._finish(row, "stop", now)
        elif n >= row.max_new:
            self._finish(row, "length", now)
        elif n - row.num_reported >= self._progress_every:
            row.num_reported = n
            self._on_progress(row, now)
        return row.is_done
