"""The running batch of the embedded engine: one step over the scheduler's rows (admit and prefill,
decode or verify drafts, sample, emit, compact), the torch half of the split: `scheduler` decides
which rows wait, run and leave, and in which KV cache slot.  No threads here:
`embedded.EmbeddedEngine` owns the loop and the request bookkeeping."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import torch

from rollpacker.backends.embedded.runner import Runner
from rollpacker.backends.embedded.sampling import sample, verify
from rollpacker.backends.embedded.scheduler import Row, RowScheduler, RowStatus
from rollpacker.backends.embedded.speculation import Speculator


class RunningBatch:
    """Rows decoding in the runner's slots and requests waiting for one.  `on_progress(row, now)`
    and `on_finish(row, reason, now)` report to the engine."""

    def __init__(self, runner: Runner, speculator: Speculator, *, capacity: int, admit_fraction: float,
                 max_prefill_tokens: int, stop_token_ids: frozenset[int], progress_every: int,
                 on_progress: Callable[[Row, float], None], on_finish: Callable[[Row, str, float], None],
                 detokenize: Callable[[list[int]], str] | None = None) -> None:
        self._runner = runner
        self._speculator = speculator
        self.scheduler = RowScheduler(capacity=capacity, admit_fraction=admit_fraction,
                                   max_prefill_tokens=max_prefill_tokens)
        self._stop_token_ids = stop_token_ids
        self._progress_every = progress_every
        self._on_progress = on_progress
        self._on_finish = on_finish
        self._detokenize = detokenize  # token ids -> text, for requests with stop strings
        self.version = 0  # weight version given to rows admitted from now on

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def add(self, rows: Iterable[Row]) -> None:
        self.scheduler.add(rows)

    def abort(self, request_ids: Iterable[str]) -> None:
        for row in self.scheduler.abort(request_ids):
            self._report(row, "abort")

    def abort_all(self) -> None:
        for row in self.scheduler.abort_all():
            self._report(row, "abort")

    def _finish(self, row: Row, reason: str, now: float) -> None:
        self.scheduler.finish(row)
        self._report(row, reason, now)

    def _report(self, row: Row, reason: str, now: float | None = None) -> None:
        self._speculator.release(row.rid)
        self._on_finish(row, reason, time.monotonic() if now is None else now)

    def step(self) -> None:
        self._compact()
        self._admit()
        rows = self.scheduler.running
        if not rows:
            if not self.scheduler.waiting and not self._runner.is_cuda:
                self._runner.release()  # idle: give the KV cache's memory back to the trainer
            return
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
        """Take finished rows out of the batch: the scheduler says which slot moves where."""
        for move in self.scheduler.compact():
            self._runner.move(move.src, move.dst, move.cache_len)

    def _admit(self) -> None:
        """Prefill the rows the scheduler admits into their slots, batched (see `admit_fraction`)."""
        admission = self.scheduler.admit()
        if admission is None:
            return
        admit = admission.rows
        for row in admit:
            row.version = self.version
            self._speculator.track(row.rid, row.request.group or row.rid, row.tokens, row.num_prompt)
        logits = self._runner.prefill(admission.first_slot, [r.tokens for r in admit])
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

    def _append(self, row: Row, token: int, logprob: float, now: float) -> bool:
        """Record one generated token; finish the row on a stop token or its length.  True if done."""
        if row.status is not RowStatus.RUNNING:  # a finished row left the batch at the last compact
            raise RuntimeError(f"request {row.rid!r}: a token after the request finished (engine bug)")
        row.tokens.append(token)
        row.logprobs.append(logprob)
        n = row.num_generated
        eos = token in self._stop_token_ids and not row.request.ignore_eos
        if eos or token in row.request.stop_token_ids or self._stop_string(row):
            self._finish(row, "stop", now)
        elif n >= row.max_new:
            self._finish(row, "length", now)
        elif n - row.num_reported >= self._progress_every:
            row.num_reported = n
            self._on_progress(row, now)
        return row.is_finished
