"""Metrics: SortedRL's bubble ratio from busy intervals, the epoch ledger (lost / duplicate prompts)
and the per-step record whose field names `rollpacker simulate`, the reference trainer and the
benchmarks share.

Bubble ratio (SortedRL): sum_k (Q - r_k) * dt_k / (T * Q), where Q is the engine's batch capacity
and r_k the requests running during interval k of a rollout lasting T.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs
from attrs import define, field, frozen

from .commands import RoundReport
from .records import PromptKey


def bubble_ratio(times: Sequence[float], running: Sequence[int], capacity: int, end: float) -> float:
    """Bubble ratio of a piecewise-constant running count: `running[k]` requests from `times[k]`
    until the next time (or `end`).  Running counts above capacity count as capacity."""
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    if not times:
        return 0.0
    start = times[0]
    total = end - start
    if total <= 0:
        return 0.0
    idle = 0.0
    for k, t in enumerate(times):
        t_next = times[k + 1] if k + 1 < len(times) else end
        idle += (capacity - min(running[k], capacity)) * (t_next - t)
    return idle / (total * capacity)


@define
class Occupancy:
    """Running-request count over time, fed by launches and ends: an append-only log (one per
    round) a driver keeps beside the core, linear in its events (a copy per event was quadratic:
    1.75 s at 25,600 launches and ends)."""

    times: list[float] = field(factory=list)
    running: list[int] = field(factory=list)

    def change(self, at: float, delta: int) -> None:
        """`delta` requests started (+) or ended (-) at `at` (never before the last change)."""
        if self.times and at < self.times[-1]:
            raise ValueError(f"time went backwards: {at} < {self.times[-1]}")
        self.times.append(at)
        self.running.append((self.running[-1] if self.running else 0) + delta)

    def bubble_ratio(self, capacity: int, end: float) -> float:
        return bubble_ratio(self.times, self.running, capacity, end)


@frozen
class EpochLedger:
    """Which prompt keys were trained, to count duplicates (a key trained twice) and check losses."""

    trained: frozenset[PromptKey] = frozenset()
    duplicates: int = 0

    def record(self, keys: Iterable[PromptKey]) -> EpochLedger:
        keys = tuple(keys)
        dup = sum(1 for k in keys if k in self.trained) + (len(keys) - len(set(keys)))
        return attrs.evolve(self, trained=self.trained | set(keys), duplicates=self.duplicates + dup)

    def lost(self, drawn: Iterable[PromptKey], pending: Iterable[PromptKey]) -> int:
        """Keys drawn from the pool that are neither trained nor still pending."""
        pending = set(pending)
        return sum(1 for k in drawn if k not in self.trained and k not in pending)


def step_record(report: RoundReport, **timings: float) -> dict:
    """The per-step metrics record (same names in the simulator's JSON and the trainer's JSONL)."""
    trained_tokens = report.kept_tokens
    record = {
        "step": report.step,
        "round": report.kind,
        "short_rounds": int(report.kind == "short"),
        "long_rounds": int(report.kind == "long"),
        "generated_tokens": report.generated_tokens,
        "kept_tokens": report.kept_tokens,
        "wasted_tokens": report.wasted_tokens,
        "carried_tokens": report.carried_tokens,
        "offpolicy_tokens": report.offpolicy_tokens,
        "on_policy_fraction": 1.0 - report.offpolicy_tokens / trained_tokens if trained_tokens else 1.0,
        "staleness": {str(lag): n for lag, n in report.staleness},
        "trained_prompts": report.trained_prompts,
        "deferred_prompts": report.deferred_prompts,
        "launched_requests": report.launched_requests,
        "retried_requests": report.retried_requests,
        "mean_kept_length": report.mean_kept_length,
        "mean_generated_length": report.mean_generated_length,
    }
    record.update(timings)
    return record
