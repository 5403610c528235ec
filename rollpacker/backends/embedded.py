"""The embedded rollout engine: continuous batching over a local HF causal LM, in this process.

`EmbeddedEngine` implements `rollpacker.core.protocols.RolloutEngine`.  A background thread owns the
model and runs the loop: apply commands (new requests, aborts, weight updates), admit waiting
requests into the running batch, decode one token for every running row, emit progress and results
into a queue that `poll` reads.  Rows join and leave the batch between decode steps (see
`embedded_runner` for the cache layout).

Why our own engine and not transformers' continuous batching: on CPU that one packs every request
into one sequence with a dense mask and ran slower than a padded static `generate`
(benchmarks/engine_throughput.py measures all three).

Contract details beyond the Protocol:
- Every submitted request yields exactly one `GenerationResult`; an aborted one carries the tokens
  generated so far (possibly none) and finish_reason "abort".  Aborting an id that already
  finished (a normal race) does nothing; an id never submitted raises `UnknownRequest`.
- A stop token (the model's EOS by default) ends a request with "stop" and is included in its
  tokens; `max_new_tokens` (clamped to the model's context) ends it with "length".
- `weight_version` of a result is the version of the weights when the request started decoding.
  Weights are swapped between decode steps; call it between `pause()` and `resume()` so no running
  request sees two policies.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import traceback
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from attrs import define, field

from rollpacker.backends._drain import drain
from rollpacker.backends.embedded_runner import Batch, Runner, sample
from rollpacker.backends.embedded_weights import apply_state, check_state, load_state
from rollpacker.backends.models import load_model
from rollpacker.core.errors import ConfigError, RollpackerError, SchedulerMisuse
from rollpacker.core.protocols import GenerationProgress, GenerationRequest, GenerationResult


class UnknownRequest(SchedulerMisuse):
    """abort() named a request id this engine never received."""


class EngineFailed(RollpackerError):
    """The engine's decode thread died; the cause is chained."""


@define(eq=False)
class _Row:
    request: GenerationRequest
    prompt: list[int]
    max_new: int
    generator: torch.Generator | None
    version: int = -1
    token_ids: list[int] = field(factory=list)
    logprobs: list[float] = field(factory=list)
    is_done: bool = False
    num_reported: int = 0


class EmbeddedEngine:
    """Continuous-batching rollout engine over a local HF causal LM.

    model: a directory (None: the default SmolLM2-135M-Instruct) or an already loaded
    `PreTrainedModel` (then `tokenizer_pad_id` defaults to its config's pad/eos id).
    capacity: the most rows decoded at once.  progress_every: emit a `GenerationProgress` per
    request every this many tokens.  stop_token_ids: None for the model's EOS ids; () to ignore
    EOS (benchmarks force exact lengths that way).  rebuild_fraction: compact and admit once dead
    rows plus admittable requests reach this share of the batch (a rebuild copies the cache).
    max_prefill_tokens: prompt tokens admitted per prefill (at least one request).
    """

    def __init__(
        self,
        model: str | os.PathLike | Any | None = None,
        *,
        capacity: int = 64,
        dtype: str = "float32",
        device: str = "cpu",
        progress_every: int = 8,
        stop_token_ids: Sequence[int] | None = None,
        rebuild_fraction: float = 0.125,
        max_prefill_tokens: int = 8192,
        seed: int = 0,
        weight_version: int = 0,
    ):
        if capacity < 1:
            raise ConfigError(f"capacity must be >= 1, got {capacity}")
        if progress_every < 1:
            raise ConfigError(f"progress_every must be >= 1, got {progress_every}")
        if not 0.0 <= rebuild_fraction <= 1.0:
            raise ConfigError(f"rebuild_fraction must be in [0, 1], got {rebuild_fraction}")
        if model is None or isinstance(model, (str, os.PathLike)):
            model, _ = load_model(model, dtype=dtype, device=device)
        self.model = model.eval()
        config = model.config.get_text_config(decoder=True)
        self.context_len = int(getattr(config, "max_position_embeddings", 0) or 1 << 30)
        self.vocab_size = int(config.vocab_size)
        eos = model.generation_config.eos_token_id if model.generation_config else None
        eos = config.eos_token_id if eos is None else eos
        eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        self.stop_token_ids = frozenset(eos_ids if stop_token_ids is None else stop_token_ids)
        pad = config.pad_token_id if config.pad_token_id is not None else (eos_ids[0] if eos_ids else 0)
        self._runner = Runner(model, pad_token_id=int(pad))
        self._capacity = capacity
        self._progress_every = progress_every
        self._rebuild_fraction = rebuild_fraction
        self._max_prefill_tokens = max_prefill_tokens
        self._seeds = torch.Generator().manual_seed(seed)
        self._version = weight_version

        # Shared with the loop thread, guarded by _cond.
        self._cond = threading.Condition()
        self._inbox: list[_Row] = []
        self._aborts: list[str] = []
        self._weight_jobs: list[tuple[dict, int, threading.Event, list]] = []
        self._is_paused = False
        self._is_closed = False
        self._live_ids: set[str] = set()  # submitted, result not yet emitted
        self._seen_ids: set[str] = set()
        self._failure: BaseException | None = None
        self._out: queue.Queue = queue.Queue()

        # Owned by the loop thread.
        self._waiting: deque[_Row] = deque()
        self._rows: list[_Row] = []  # batch order, dead rows included until the next rebuild
        self._batch: Batch | None = None
        self._last: torch.Tensor | None = None
        self._thread = threading.Thread(target=self._loop, name="rollpacker-embedded", daemon=True)
        self._thread.start()

    # -- Protocol ---------------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def weight_version(self) -> int:
        return self._version

    def submit(self, requests: Sequence[GenerationRequest]) -> None:
        """Validate every request first (nothing is queued if one is bad), then queue them all."""
        rows = []
        with self._cond:
            self._check_open()
            batch_ids: set[str] = set()
            for r in requests:
                rows.append(self._validate(r, batch_ids))
                batch_ids.add(r.request_id)
            for row in rows:
                self._live_ids.add(row.request.request_id)
                self._seen_ids.add(row.request.request_id)
            self._inbox.extend(rows)
            self._cond.notify_all()

    def poll(self, timeout: float | None = None) -> list[GenerationProgress | GenerationResult]:
        """Events since the last poll; waits up to `timeout` for the first one (None: until one
        arrives, or returns [] at once when nothing is in flight)."""
        events = drain(self._out, timeout, self._is_idle)
        if not events and self._failure is not None:
            raise EngineFailed("the embedded engine's decode loop failed") from self._failure
        return events

    def _is_idle(self) -> bool:
        with self._cond:
            return not self._live_ids or self._failure is not None or self._is_closed

    def abort(self, request_ids: Sequence[str]) -> None:
        with self._cond:
            self._check_open()
            unknown = [r for r in request_ids if r not in self._seen_ids]
            if unknown:
                raise UnknownRequest(f"abort: unknown request id(s) {unknown[:5]!r}")
            self._aborts.extend(r for r in request_ids if r in self._live_ids)
            self._cond.notify_all()

    def pause(self) -> None:
        """Stop decoding after the current step; requests keep their state (aborts still work)."""
        with self._cond:
            self._is_paused = True
            self._cond.notify_all()

    def resume(self) -> None:
        with self._cond:
            self._is_paused = False
            self._cond.notify_all()

    def update_weights(self, weights: Mapping[str, Any] | str | os.PathLike, version: int) -> None:
        """Load HF-named tensors (a mapping, or a directory of *.safetensors) into the model between
        decode steps and set the weight version; returns once they are in."""
        state = load_state(weights)
        check_state(self.model, state)
        done, error = threading.Event(), []
        with self._cond:
            self._check_open()
            self._weight_jobs.append((state, int(version), done, error))
            self._cond.notify_all()
        while not done.wait(0.1):
            if self._failure is not None or not self._thread.is_alive():
                raise EngineFailed("the decode loop stopped before the weight update") from self._failure
        if error:
            raise error[0]

    def close(self) -> None:
        with self._cond:
            self._is_closed = True
            self._cond.notify_all()
        self._thread.join(timeout=60)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- validation (caller's thread) -------------------------------------------------------------

    def _check_open(self) -> None:
        if self._is_closed:
            raise SchedulerMisuse("the engine is closed")
        if self._failure is not None:
            raise EngineFailed("the embedded engine's decode loop failed") from self._failure

    def _validate(self, r: GenerationRequest, batch_ids: set[str]) -> _Row:
        if not isinstance(r, GenerationRequest):
            raise ConfigError(f"submit expects GenerationRequest, got {type(r).__name__}")
        rid = r.request_id
        if not isinstance(rid, str) or not rid:
            raise ConfigError(f"request_id must be a non-empty string, got {rid!r}")
        if rid in self._live_ids or rid in batch_ids:
            raise SchedulerMisuse(f"request {rid!r}: this id is already running (duplicate request_id)")
        prompt = list(r.prompt_ids) + list(r.resume_ids)
        if not r.prompt_ids:
            raise ConfigError(f"request {rid!r}: prompt_ids is empty")
        bad = [t for t in prompt if not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            raise ConfigError(f"request {rid!r}: token ids {bad[:5]} outside the vocabulary [0, {self.vocab_size})")
        if len(prompt) >= self.context_len:
            raise ConfigError(
                f"request {rid!r}: prompt (+ resume) has {len(prompt)} tokens; the model's context is "
                f"{self.context_len} tokens, leaving no room to generate"
            )
        generator = None
        if r.temperature > 0:
            seed = r.seed if r.seed is not None else int(torch.randint(0, 2**62, (1,), generator=self._seeds))
            generator = torch.Generator(device=self._runner.device).manual_seed(seed)
        return _Row(r, prompt, min(r.max_new_tokens, self.context_len - len(prompt)), generator)

    # -- the loop (engine thread) -----------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    while True:
                        if self._is_closed:
                            return
                        work = self._take_commands()
                        if work or (not self._is_paused and (self._waiting or self._num_live())):
                            break
                        self._cond.wait()
                    is_paused = self._is_paused
                if not is_paused and (self._waiting or self._num_live()):
                    self._step()
        except BaseException as exc:  # surfaced by poll/submit
            traceback.print_exc()
            self._failure = exc
        finally:
            self._close_all()

    def _take_commands(self) -> bool:
        """Apply queued submissions, aborts and weight updates (lock held). True if any."""
        work = bool(self._inbox or self._aborts or self._weight_jobs)
        self._waiting.extend(self._inbox)
        self._inbox.clear()
        if self._aborts:
            ids = set(self._aborts)
            self._aborts.clear()
            for row in self._rows:
                if not row.is_done and row.request.request_id in ids:
                    self._finish(row, "abort")
            kept = deque()
            for row in self._waiting:
                if row.request.request_id in ids:
                    self._finish(row, "abort")
                else:
                    kept.append(row)
            self._waiting = kept
        for state, version, done, error in self._weight_jobs:
            try:
                apply_state(self.model, state)
                self._version = version
            except Exception as exc:  # reported to the caller of update_weights
                error.append(exc)
            done.set()
        self._weight_jobs.clear()
        return work

    def _num_live(self) -> int:
        return sum(not r.is_done for r in self._rows)

    def _step(self) -> None:
        self._maybe_rebuild()
        if self._batch is None:
            return
        logits = self._runner.decode(self._batch, self._last)
        self._last = self._emit_tokens(logits, self._rows)
        if not self._waiting and not self._num_live():
            # idle: give the KV cache's memory back (the trainer may need it between rounds)
            self._rows, self._batch, self._last = [], None, None

    def _maybe_rebuild(self) -> None:
        """Compact out dead rows and admit waiting requests, when worth a cache copy."""
        num_live = self._num_live()
        num_dead = len(self._rows) - num_live
        admit = self._pick_admissions(self._capacity - num_live)
        threshold = max(1, int(self._rebuild_fraction * max(len(self._rows), 1)))
        if num_live and num_dead + len(admit) < threshold:
            self._waiting.extendleft(reversed(admit))
            return
        if not num_dead and not admit:
            return
        keep = [i for i, r in enumerate(self._rows) if not r.is_done]
        new_batch = None
        if admit:
            version = self._version
            for row in admit:
                row.version = version
            new_batch, logits = self._runner.prefill([r.prompt for r in admit])
        if not keep and new_batch is None:
            self._rows, self._batch, self._last = [], None, None
            return
        old_last = self._last[keep] if keep else None
        self._batch = self._runner.rebuild(self._batch if keep else None, keep, new_batch)
        self._rows = [self._rows[i] for i in keep] + admit
        if admit:
            new_last = self._emit_tokens(logits, admit)
            self._last = new_last if old_last is None else torch.cat([old_last, new_last])
        else:
            self._last = old_last

    def _pick_admissions(self, free: int) -> list[_Row]:
        admit, budget = [], self._max_prefill_tokens
        while self._waiting and len(admit) < free:
            size = len(self._waiting[0].prompt)
            if admit and size > budget:
                break
            budget -= size
            admit.append(self._waiting.popleft())
        return admit

    def _emit_tokens(self, logits: torch.Tensor, rows: list[_Row]) -> torch.Tensor:
        """Sample one token per row of `rows` (dead rows get a pad), record it, emit events;
        returns the tokens as the next step's input."""
        tokens, logprobs = sample(
            logits,
            [r.request.temperature for r in rows],
            [r.request.top_p for r in rows],
            [r.generator for r in rows],
        )
        now = time.monotonic()
        for row, tok, lp in zip(rows, tokens, logprobs):
            if row.is_done:
                continue
            row.token_ids.append(tok)
            row.logprobs.append(lp)
            n = len(row.token_ids)
            if tok in self.stop_token_ids:
                self._finish(row, "stop", now)
            elif n >= row.max_new:
                self._finish(row, "length", now)
            elif n - row.num_reported >= self._progress_every:
                row.num_reported = n
                self._out.put(GenerationProgress(row.request.request_id, n, now))
        return torch.tensor(tokens, dtype=torch.long, device=self._runner.device)

    def _finish(self, row: _Row, reason: str, now: float | None = None) -> None:
        row.is_done = True
        rid = row.request.request_id
        self._out.put(
            GenerationResult(
                request_id=rid,
                token_ids=tuple(row.token_ids),
                logprobs=tuple(row.logprobs),
                finish_reason=reason,
                weight_version=row.version if row.version >= 0 else self._version,
                at=time.monotonic() if now is None else now,
            )
        )
        with self._cond:
            self._live_ids.discard(rid)

    def _close_all(self) -> None:
        """On close or failure, every request still in flight ends as aborted."""
        with self._cond:
            self._waiting.extend(self._inbox)
            self._inbox.clear()
        for row in list(self._rows) + list(self._waiting):
            if not row.is_done:
                self._finish(row, "abort")
        self._rows, self._waiting, self._batch = [], deque(), None
        for _, _, done, error in self._weight_jobs:
            error.append(EngineFailed("the engine closed before the weight update"))
            done.set()

