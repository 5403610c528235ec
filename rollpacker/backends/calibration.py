"""Time a real rollout engine for the simulator's latency model (`rollpacker.sim.engine_profile`).

    cal = Calibration(engine, vocab_size=V)
    runs = cal.grid(rows=(1, 4, 16), prompts=(32, 256), news=(16, 64, 128))
    profile = fit_profile(runs, engine="embedded", ..., max_running=engine.capacity, kv_capacity=...,
                          **fit_abort(cal.aborts(new=64)))

Each run submits `rows` requests together, each with its own random prompt of `prompt` token ids (distinct,
so no engine shares a prefill between them) and `ignore_eos`, generating exactly `new` tokens, and
takes the seconds from the submission to the last result: prefill, then `new` decode steps of `rows`
rows.  Works through the `RolloutEngine` protocol alone: the embedded engine, SGLang servers (one
server: a profile is one instance), `rollpacker serve`.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable, Iterable

import numpy as np

from rollpacker.core.protocols import GenerationRequest, GenerationResult, RolloutEngine
from rollpacker.sim.engine_profile import Run

POLL_S = 0.005


class Calibration:
    """Timed runs on one engine; `tick()` is called between runs (a progress bar)."""

    def __init__(self, engine: RolloutEngine, *, vocab_size: int, seed: int = 0, timeout_s: float = 600.0,
                 tick: Callable[[], None] = lambda: None) -> None:
        self.engine = engine
        self.vocab_size = vocab_size
        self.rng = np.random.default_rng(seed)
        self.timeout_s = timeout_s
        self.tick = tick
        self._count = itertools.count()

    def _requests(self, rows: int, prompt: int, new: int) -> list[GenerationRequest]:
        return [GenerationRequest(f"cal{next(self._count):010d}", tuple(int(t) for t in self.rng.integers(
            10, self.vocab_size, prompt)), new, temperature=1.0, seed=int(self.rng.integers(1 << 30)),
            ignore_eos=True) for _ in range(rows)]

    def _wait(self, ids: set[str]) -> dict[str, GenerationResult]:
        results: dict[str, GenerationResult] = {}
        deadline = time.monotonic() + self.timeout_s
        while len(results) < len(ids):
            if time.monotonic() > deadline:
                raise TimeoutError(f"calibration: {len(ids) - len(results)} requests unanswered after "
                                   f"{self.timeout_s:g} s")
            for out in self.engine.poll(POLL_S):
                if isinstance(out, GenerationResult) and out.request_id in ids:
                    results[out.request_id] = out
        return results

    def run(self, rows: int, prompt: int, new: int) -> float:
        """Seconds from submitting `rows` requests to the last result."""
        requests = self._requests(rows, prompt, new)
        start = time.monotonic()
        self.engine.submit(requests)
        results = self._wait({r.request_id for r in requests})
        seconds = time.monotonic() - start
        short = [r for r in results.values() if len(r.token_ids) != new]
        if short:
            raise RuntimeError(f"calibration: request {short[0].request_id} ended after {len(short[0].token_ids)} "
                               f"tokens, not {new} ({short[0].finish_reason}): the engine did not honour ignore_eos")
        self.tick()
        return seconds

    def grid(self, rows: Iterable[int], prompts: Iterable[int], news: Iterable[int], repeats: int = 2) -> list[Run]:
        """One `Run` per (rows, prompt, new), its seconds the median of `repeats` runs (after one warm-up)."""
        cells = list(itertools.product(rows, prompts, news))
        self.run(*min(cells))  # warm-up: first-call costs (allocation, kernels) are no step's
        return [Run(b, p, n, statistics.median(self.run(b, p, n) for _ in range(repeats))) for b, p, n in cells]

    def abort_s(self, rows: int = 4, prompt: int = 32, new: int = 2048, after_s: float = 0.2, repeats: int = 3) -> float:
        """Median seconds from aborting `rows` running requests (in one call) to their last abort result."""
        times = []
        for _ in range(repeats):
            requests = self._requests(rows, prompt, new)
            self.engine.submit(requests)
            time.sleep(after_s)
            start = time.monotonic()
            self.engine.abort([r.request_id for r in requests])
            results = self._wait({r.request_id for r in requests})
            times.append(time.monotonic() - start)
            if all(len(r.token_ids) >= new for r in results.values()):
                raise RuntimeError(f"calibration: {rows} requests of {new} tokens finished within {after_s:g} s, "
                                   f"before their abort: nothing was aborted (raise new)")
            self.tick()
        return statistics.median(times)

    def aborts(self, rows: Iterable[int] = (1, 2, 4, 8), **kwargs) -> list[tuple[int, float]]:
        """(requests caught, `abort_s` of that many) for each count: the abort latency's growth with the
        requests one abort catches (`rollpacker.sim.engine_profile.fit_abort`)."""
        return [(b, self.abort_s(rows=b, **kwargs)) for b in rows]


def time_trainer(trainer, *, vocab_size: int, rows=(2, 8, 32), prompts=(32, 128), responses=(8, 64),
                 repeats: int = 2, seed: int = 0, tick: Callable[[], None] = lambda: None) -> list[tuple]:
    """(rows, prompt, response, seconds) of `trainer.forward_backward` on micro-batches of `rows` random
    samples of `prompt` + `response` tokens (the median of `repeats`, after one warm-up), then the optimizer
    step (the median of `repeats` warm steps, each after a backward, as the last item: (0, 0, 0, seconds)).
    The first step is not timed: it allocates the optimizer's state (on the tiny model 35-90 ms against the
    live path's 12-18 ms).  The weights move: calibrate a trainer that is thrown away afterwards."""
    from rollpacker.core.protocols import MicroBatch, TrainSample

    rng = np.random.default_rng(seed)

    def batch(b: int, p: int, r: int) -> MicroBatch:
        return MicroBatch(tuple(TrainSample(tuple(int(t) for t in rng.integers(10, vocab_size, p)),
                                            tuple(int(t) for t in rng.integers(10, vocab_size, r)),
                                            advantage=float(rng.standard_normal()), token_weight=1.0)
                                for _ in range(b)))

    def timed(b: int, p: int, r: int) -> float:
        micro = batch(b, p, r)
        start = time.monotonic()
        trainer.forward_backward(micro)
        tick()
        return time.monotonic() - start

    cells = list(itertools.product(rows, prompts, responses))
    timed(*min(cells))
    timings = [(b, p, r, statistics.median(timed(b, p, r) for _ in range(repeats))) for b, p, r in cells]
    trainer.optimizer_step(1.0)  # allocates the optimizer's state
    return timings + [(0, 0, 0, statistics.median(_optimizer_step_s(trainer, batch(*min(cells)))
                                                  for _ in range(repeats)))]


def _optimizer_step_s(trainer, micro) -> float:
    """Seconds of one optimizer step after a backward (without gradients it would skip every parameter)."""
    trainer.forward_backward(micro)
    start = time.monotonic()
    trainer.optimizer_step(1.0)
    return time.monotonic() - start
