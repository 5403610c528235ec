"""The embedded rollout engine: continuous batching over a local HF causal LM, in this process.

`EmbeddedEngine` implements `rollpacker.core.protocols.RolloutEngine`.  A background thread owns the
model and runs the loop: apply commands (new requests, aborts, weight updates), admit waiting
requests into the running batch, decode one token for every running row (or, in the tail, verify
a few speculative draft tokens per row: `speculation`), emit progress and results into a
queue that `poll` reads.  Rows join and leave the batch between decode steps (see
`runner` for the slot cache and the CUDA graphs).

Why our own engine and not transformers' continuous batching: on CPU that one packs every request
into one sequence with a dense mask and ran slower than a padded static `generate`
(benchmarks/engine_throughput.py measures all three).

Contract details beyond the Protocol:
- Every submitted request yields exactly one `GenerationResult`; an aborted one carries the tokens
  generated so far (possibly none) and finish_reason "abort".  Aborting an id that already
  finished (a normal race) does nothing; an id never submitted raises `UnknownRequest`.
- A stop token (the model's EOS by default, and the request's `stop_token_ids`) ends a request with
  "stop" and is included in its tokens; so does a token after which the response's text holds one of
  the request's `stop` strings (decoded with the tokenizer); `max_new_tokens` (clamped to the
  model's context) ends it with "length".
- `weight_version` of a result is the version of the weights when the request started decoding.
  Weights are swapped between decode steps; call it between `pause()` and `resume()` so no running
  request sees two policies.
- Colocated mode (`ReleasableEngine`): `release_memory(tags)` while nothing is in flight frees the
  weights and/or the KV cache (`memory`); `resume_memory(tags)` allocates them again, and the
  weights hold nothing until `update_weights` loads them: until then `submit` raises `EngineReleased`.
"""

from __future__ import annotations

import os
import queue
import threading
import traceback
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch

from rollpacker.backends._drain import drain
from rollpacker.backends.embedded.batch import RunningBatch
from rollpacker.backends.embedded.forward_timing import ForwardTimes, time_idle
from rollpacker.backends.embedded.memory import EngineMemory
from rollpacker.backends.embedded.runner import Runner
from rollpacker.backends.embedded.scheduler import MAX_PREFILL_TOKENS, Row
from rollpacker.backends.embedded.speculation import SpeculationStats, Speculator, speculation_rows
from rollpacker.backends.embedded.weights import apply_state, check_state, load_state
from rollpacker.backends.errors import BackendMisuse, EngineFailed
from rollpacker.backends.models import load_model
from rollpacker.backends.requests import RequestIds, UnknownRequest  # noqa: F401 (abort raises it)
from rollpacker.core.errors import ConfigError
from rollpacker.core.protocols import GenerationProgress, GenerationRequest, GenerationResult, check_memory_tags


class EngineReleased(BackendMisuse):
    """A request or a weight update came while the engine's memory is released (colocated mode)."""


class EmbeddedEngine:
    """Continuous-batching rollout engine over a local HF causal LM.

    model: a directory (None: the default SmolLM2-135M-Instruct) or an already loaded
    `PreTrainedModel` (then the pad id defaults to its config's pad/eos id).
    capacity: the most rows decoded at once.  device/dtype: where and how a model given as a
    directory is loaded (a loaded model stays where it is).  progress_every: emit a
    `GenerationProgress` per request every this many tokens.  stop_token_ids: None for the model's
    EOS ids; () to ignore EOS (benchmarks force exact lengths that way).  admit_fraction: while
    rows are running, admit waiting requests once this share of the running rows' count can be
    admitted together (prefill is batched), or when every waiting request fits.
    max_prefill_tokens: prompt tokens admitted per prefill (at least one request).
    attention: "matmul" or "sdpa" for decode (see `runner`); None: sdpa on CPU (measured
    faster there), matmul on CUDA (graph-friendly, no per-head copy of the cache).  cuda_graphs: replay
    decode steps as CUDA graphs (None: on CUDA; True on CPU is an error); with kv_tokens_per_row every
    graph is captured here, before the first request (`capture_s` is the time spent), else whenever
    the growing cache takes a new size.
    spec_max_rows: speculative decoding when at most this many rows run (0: off; None:
    `SPEC_MAX_ROWS_CUDA` on CUDA, off on CPU, where a 5-token forward costs 1.3-2x a 1-token one and
    speculation measured 0.85-1.04x at 1-4 rows); spec_tokens: draft tokens per row and verify step; spec_ngram: longest suffix matched.
    kv_tokens_per_row: KV cache columns per row allocated at once (the longest prompt plus the most
    new tokens); None: the cache grows by doubling as rows get longer.
    tokenizer: decodes responses for requests with `stop` strings (a model given as a directory
    brings its own; without one such requests are refused).
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
        admit_fraction: float = 0.125,
        max_prefill_tokens: int = MAX_PREFILL_TOKENS,
        seed: int = 0,
        weight_version: int = 0,
        attention: str | None = None,
        cuda_graphs: bool | None = None,
        spec_max_rows: int | None = None,
        spec_tokens: int = 4,
        spec_ngram: int = 3,
        kv_tokens_per_row: int | None = None,
        tokenizer: Any | None = None,
    ):
        if capacity < 1:
            raise ConfigError(f"capacity must be >= 1, got {capacity}")
        if progress_every < 1:
            raise ConfigError(f"progress_every must be >= 1, got {progress_every}")
        if not 0.0 <= admit_fraction <= 1.0:
            raise ConfigError(f"admit_fraction must be in [0, 1], got {admit_fraction}")
        if attention not in (None, "matmul", "sdpa"):
            raise ConfigError(f"attention must be 'matmul' or 'sdpa' (None: by device), got {attention!r}")
        if kv_tokens_per_row is not None and kv_tokens_per_row < 1:
            raise ConfigError(f"kv_tokens_per_row must be >= 1 (None: grow as needed), got {kv_tokens_per_row}")
        speculator = Speculator(max_rows=spec_max_rows or 0, num_tokens=spec_tokens, ngram=spec_ngram)
        if model is None or isinstance(model, (str, os.PathLike)):
            model, tokenizer = load_model(model, dtype=dtype, device=device)
        self.model = model.eval()
        self.tokenizer = tokenizer
        config = model.config.get_text_config(decoder=True)
        self.context_len = int(getattr(config, "max_position_embeddings", 0) or 1 << 30)
        self.vocab_size = int(config.vocab_size)
        eos = model.generation_config.eos_token_id if model.generation_config else None
        eos = config.eos_token_id if eos is None else eos
        eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        self.stop_token_ids = frozenset(eos_ids if stop_token_ids is None else stop_token_ids)
        pad = config.pad_token_id if config.pad_token_id is not None else (eos_ids[0] if eos_ids else 0)
        on_cuda = next(model.parameters()).device.type == "cuda"
        if cuda_graphs and not on_cuda:
            raise ConfigError(f"cuda_graphs=True needs the model on CUDA; it is on {next(model.parameters()).device}")
        if attention is None:
            attention = "matmul" if on_cuda else "sdpa"
        speculator.max_rows = speculation_rows(spec_max_rows, on_cuda)
        runner = Runner(model, pad_token_id=int(pad), capacity=capacity, attention=attention,
                        use_graphs=cuda_graphs, cols_per_slot=kv_tokens_per_row,
                        verify_rows=speculator.max_rows, verify_tokens=speculator.num_tokens)
        if runner.use_graphs and kv_tokens_per_row is not None:
            runner.reserve(kv_tokens_per_row)  # the cache and every decode graph, before any step
        self._runner = runner
        self._memory = EngineMemory(self.model, runner)
        self._capacity = capacity
        self._device = runner.device
        # Owned by the loop thread.
        self._batch = RunningBatch(
            runner, speculator, capacity=capacity, admit_fraction=admit_fraction,
            max_prefill_tokens=max_prefill_tokens, stop_token_ids=self.stop_token_ids,
            progress_every=progress_every, on_progress=self._progress, on_finish=self._finish,
            detokenize=None if tokenizer is None else tokenizer.decode)
        self._speculator = speculator
        self._seeds = torch.Generator().manual_seed(seed)
        self._version = self._batch.version = weight_version

        # Shared with the loop thread, guarded by _cond.
        self._cond = threading.Condition()
        self._inbox: list[Row] = []
        self._aborts: list[str] = []
        self._jobs: list[tuple[Any, threading.Event, list]] = []
        """Calls to run on the loop thread between decode steps (weight updates, memory), with an
        event set when done and a list that receives the call's exception."""
        self._is_paused = False
        self._is_closed = False
        self._ids = RequestIds()  # in flight: submitted, result not yet emitted
        self._failure: BaseException | None = None
        self._out: queue.Queue = queue.Queue()

        self._thread = threading.Thread(target=self._loop, name="rollpacker-embedded", daemon=True)
        self._thread.start()

    @property
    def capture_s(self) -> float:
        """Seconds spent capturing CUDA graphs (0 without them); never part of a step's time when
        the engine was built with kv_tokens_per_row (all captured in the constructor)."""
        return self._runner.capture_s

    @property
    def speculation_stats(self) -> SpeculationStats:
        """Draft tokens proposed and accepted so far (accepted tokens per verify step)."""
        return self._speculator.stats

    # -- Protocol ---------------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def weight_version(self) -> int:
        return self._version

    def submit(self, requests: Sequence[GenerationRequest]) -> None:
        """Validate every request first (nothing is queued if one is bad), then queue them all."""
        with self._cond:
            self._check_open()
            refusal = self._memory.refusal()
            if refusal is not None:
                raise EngineReleased(f"submit: {refusal}")
            self._ids.check(requests)
            rows = [self._validate(r) for r in requests]
            self._ids.add(requests)
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
            return not self._ids.live or self._failure is not None or self._is_closed

    def abort(self, request_ids: Sequence[str]) -> None:
        with self._cond:
            self._check_open()
            self._ids.check_known(request_ids)
            self._aborts.extend(r for r in request_ids if r in self._ids.live)
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
        if "weights" in self._memory.released:
            raise EngineReleased("update_weights: the weights are released; resume_memory(['weights']) first")
        state = load_state(weights)
        check_state(self.model, state)

        def load() -> None:
            apply_state(self.model, state)
            self._memory.loaded(state)
            self._version = self._batch.version = int(version)

        error = self._on_loop(load, f"the weight update to version {version}")
        if error is not None:  # raised on the decode thread while copying the tensors into the model
            raise EngineFailed(f"update_weights to version {version}: copying the weights into the model "
                               f"failed ({type(error).__name__}: {error})") from error

    def release_memory(self, tags: Sequence[str] | None = None) -> None:
        """Free the memory of `tags` ("weights", "kv_cache"; None: both) while nothing is in flight;
        the weights' contents are lost (a weight update brings them back after `resume_memory`)."""
        tags = check_memory_tags(tags)
        with self._cond:
            self._check_open()
            if self._ids.live or self._inbox:
                raise BackendMisuse(f"release_memory: {len(self._ids)} request(s) still in flight; abort them "
                                    f"and poll their results first")
            self._memory.released.update(tags)  # from now on submit refuses
        error = self._on_loop(lambda: self._memory.free(tags), "releasing memory")
        if error is not None:
            raise EngineFailed(f"release_memory {list(tags)}: {type(error).__name__}: {error}") from error

    def resume_memory(self, tags: Sequence[str] | None = None) -> None:
        """Allocate the memory of `tags` again (None: every released one): the weights first, empty
        until `update_weights`; on CUDA the KV cache at its planned size and every decode graph."""
        tags = check_memory_tags(tags)
        error = self._on_loop(lambda: self._memory.allocate(tags), "resuming memory")
        if isinstance(error, BackendMisuse):
            raise error
        if error is not None:
            raise EngineFailed(f"resume_memory {list(tags)}: {type(error).__name__}: {error}") from error

    def memory_bytes(self) -> dict[str, int]:
        """Bytes the engine's weights and its KV cache hold now ({"weights": .., "kv_cache": ..})."""
        return self._memory.nbytes()

    def time_forwards(self, **sizes) -> ForwardTimes:
        """`forward_timing.time_idle` on the loop thread: single forwards timed while nothing is in flight."""
        timed: list[ForwardTimes] = []
        error = self._on_loop(lambda: timed.append(time_idle(self, **sizes)), "timing forwards")
        if error is not None:
            raise error
        return timed[0]

    def keep_draft_groups(self, groups: Collection[str]) -> None:
        """`DraftKeepingEngine`: the drafter keeps these groups' finished and aborted requests as
        sources, whatever else runs, until a later call leaves a group out (`drafter.Drafter.keep`)."""
        kept = frozenset(groups)
        error = self._on_loop(lambda: self._speculator.keep(kept), "keeping draft groups")
        if error is not None:
            raise error

    def _on_loop(self, call, what: str) -> BaseException | None:
        """Run `call()` on the loop thread between decode steps and wait; returns its exception."""
        done, error = threading.Event(), []
        with self._cond:
            self._check_open()
            self._jobs.append((call, done, error))
            self._cond.notify_all()
        while not done.wait(0.1):
            if self._failure is not None or not self._thread.is_alive():
                raise EngineFailed(f"the decode loop stopped before {what}") from self._failure
        if error and isinstance(error[0], EngineFailed):
            raise error[0]
        return error[0] if error else None

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
            raise BackendMisuse("the engine is closed")
        if self._failure is not None:
            raise EngineFailed("the embedded engine's decode loop failed") from self._failure

    def _validate(self, r: GenerationRequest) -> Row:
        """This engine's checks on top of `RequestIds.check` (vocabulary, context); the request's row."""
        return Row.checked(r, vocab_size=self.vocab_size, context_len=self.context_len,
                           has_tokenizer=self.tokenizer is not None,
                           draw_seed=lambda: int(torch.randint(0, 2**62, (1,), generator=self._seeds)))

    # -- the loop (engine thread) -----------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    while True:
                        if self._is_closed:
                            return
                        work = self._take_commands()
                        if work or (not self._is_paused and self._batch.has_work):
                            break
                        self._cond.wait()
                    is_paused = self._is_paused
                if not is_paused and self._batch.has_work:
                    self._batch.step()
        except BaseException as exc:  # surfaced by poll/submit
            traceback.print_exc()
            self._failure = exc
        finally:
            self._close_all()

    def _take_commands(self) -> bool:
        """Apply queued submissions, aborts, weight updates and memory calls (lock held). True if any."""
        work = bool(self._inbox or self._aborts or self._jobs)
        self._batch.add(self._inbox)
        self._inbox.clear()
        if self._aborts:
            self._batch.abort(self._aborts)
            self._aborts.clear()
        for call, done, error in self._jobs:
            try:
                call()
            except Exception as exc:  # reported to the caller
                error.append(exc)
            done.set()
        self._jobs.clear()
        return work

    def _progress(self, row: Row, now: float) -> None:
        self._out.put(GenerationProgress(row.rid, row.num_generated, now))

    def _finish(self, row: Row, reason: str, now: float) -> None:
        result = GenerationResult(
            request_id=row.rid,
            token_ids=tuple(row.token_ids),
            logprobs=tuple(row.logprobs),
            finish_reason=reason,
            weight_version=row.version if row.version >= 0 else self._version,
            at=now,
        )
        with self._cond:  # out and no longer live at once: whoever polled it sees nothing in flight
            self._out.put(result)
            self._ids.done(row.rid)

    def _close_all(self) -> None:
        """On close or failure, every request still in flight ends as aborted."""
        with self._cond:
            self._batch.add(self._inbox)
            self._inbox.clear()
        self._batch.abort_all()
        for _, done, error in self._jobs:
            error.append(EngineFailed("the engine closed before the weight update or memory call"))
            done.set()
