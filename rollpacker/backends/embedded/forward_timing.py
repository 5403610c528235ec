"""The embedded engine's forwards timed one at a time: a decode step (its forward and its sampling) at each rows
count, at a short and a longer context, and a prefill at each prompt length.  These are the engine profile's
decode and prefill costs measured directly (`EngineProfile.decode_rows`), where a forward's cost is not linear in
its rows: on a 2-core CPU SmolLM2-135M decodes 1 row in 38 ms, 2-8 rows in 62-67 ms and 16 rows in 83 ms, so a
line fitted on whole runs (t0 + t1 x rows) charges a round's small and full batches wrongly.

Run on the engine's loop thread while it is idle (`EmbeddedEngine.time_forwards`): the timed rows use the KV
cache's slots from 0 up, which no request holds then."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import torch
from attrs import frozen

from rollpacker.backends.embedded.runner import Runner
from rollpacker.backends.embedded.sampling import sample
from rollpacker.core.errors import ConfigError


@frozen
class ForwardTimes:
    """Median seconds of single forwards: `decode` (rows, seconds) with each row holding `context` tokens, the
    same at `long_context` (`decode_long`), and `prefill` (prompt tokens, seconds) of one prompt."""

    context: int
    long_context: int
    decode: tuple[tuple[int, float], ...]
    decode_long: tuple[tuple[int, float], ...]
    prefill: tuple[tuple[int, float], ...]


def time_idle(engine, *, rows: Sequence[int], **sizes) -> ForwardTimes:
    """`time_forwards` on an `EmbeddedEngine`'s runner (on its loop thread) while its running batch holds nothing
    (the timed rows take the KV cache's first slots), at most its capacity rows; else a `ConfigError` saying which."""
    if max(rows) > engine.capacity:
        raise ConfigError(f"time_forwards: {max(rows)} rows is more than the engine's capacity {engine.capacity}")
    if engine._batch.has_work:
        raise ConfigError("time_forwards: requests are in flight; time the forwards while the engine is idle")
    return time_forwards(engine._runner, vocab_size=engine.model.config.vocab_size, rows=rows, **sizes)


def time_forwards(runner: Runner, *, vocab_size: int, rows: Sequence[int], context: int, long_context: int,
                  prompts: Sequence[int], repeats: int = 5, seed: int = 0) -> ForwardTimes:
    """Each forward `repeats` times after one untimed (warm-up), their median; random token ids from `seed`."""
    generator = torch.Generator().manual_seed(seed)

    def ids(n: int, t: int) -> torch.Tensor:
        return torch.randint(0, vocab_size, (n, t), generator=generator)

    with torch.inference_mode():
        prefill = tuple((p, _median(runner, lambda p=p: runner.prefill(0, [ids(1, p)[0].tolist()]), repeats))
                        for p in prompts)
        decode, decode_long = (_decode_times(runner, ids, rows, c, repeats) for c in (context, long_context))
    return ForwardTimes(context=context, long_context=long_context, decode=tuple(decode),
                        decode_long=tuple(decode_long), prefill=prefill)


def _decode_times(runner: Runner, ids, rows: Sequence[int], context: int, repeats: int) -> tuple:
    """(rows, seconds) of a decode step at each of `rows` rows holding `context` tokens each: the forward of their
    last tokens and the sampling of the next (as `batch.RunningBatch.step` runs them); the most rows' caches
    filled by one prefill first (a step at fewer rows reads the first of them)."""
    runner.prefill(0, [ids(1, context)[0].tolist() for _ in range(max(rows))])
    device = runner.device

    def step(b: int) -> None:
        params = (torch.ones(b, device=device), None, torch.arange(b, device=device),
                  torch.zeros(b, dtype=torch.long, device=device))
        sample(runner.decode(ids(b, 1), [context] * b)[:, 0], *params)

    return tuple((b, _median(runner, lambda b=b: step(b), repeats)) for b in rows)


def _median(runner: Runner, call, repeats: int) -> float:
    call()  # warm-up: the first call at a shape allocates
    times = []
    for _ in range(repeats):
        _sync(runner)
        start = time.perf_counter()
        call()
        _sync(runner)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _sync(runner: Runner) -> None:
    if runner.is_cuda:
        torch.cuda.synchronize(runner.device)
