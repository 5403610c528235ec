"""Metrics: SortedRL's bubble ratio from an occupancy log, the epoch ledger (lost / duplicate prompts)
and the per-step record whose field names `rollpacker simulate`, the reference trainer and the
benchmarks share, built by one `step_record` from one `StepTimes` for live runs and the simulator.

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
    until the next time (or `end`), over [times[0], end]; changes at or after `end` are outside it.
    Running counts above capacity count as capacity."""
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
        if t >= end:
            break
        t_next = min(times[k + 1], end) if k + 1 < len(times) else end
        idle += (capacity - min(running[k], capacity)) * (t_next - t)
    return idle / (total * capacity)


@define
class Occupancy:
    """Running-request count over time: an append-only log (one per round) that a backend keeps
    beside the core, the live one fed by launches and ends (`change`), the simulator by the count
    over its instances (`set`); linear in its events (a copy per event was quadratic: 1.75 s at
    25,600 launches and ends).  Changes at one time collapse into one entry."""

    times: list[float] = field(factory=list)
    running: list[int] = field(factory=list)

    def set(self, at: float, running: int) -> None:
        """`running` requests run from `at` on (never before the last change)."""
        if self.times and at < self.times[-1]:
            raise ValueError(f"time went backwards: {at} < {self.times[-1]}")
        if self.times and at == self.times[-1]:
            self.running[-1] = running
        else:
            self.times.append(at)
            self.running.append(running)

    def change(self, at: float, delta: int) -> None:
        """`delta` requests started (+) or ended (-) at `at`."""
        self.set(at, (self.running[-1] if self.running else 0) + delta)

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


def split_training(spans, round_end: float) -> tuple[float, float]:
    """(before, after): the trainer's busy seconds before the round's end (hidden under the rollout)
    and after it.  `spans` are (start, end, ...) of one trainer, so they never overlap each other."""
    before = sum(max(0.0, min(end, round_end) - start) for start, end, *_ in spans)
    total = sum(end - start for start, end, *_ in spans)
    return before, total - before


@frozen(kw_only=True)
class StepTimes:
    """One step's marks on one clock (seconds) and its trainer's busy spans: all a step's timing
    fields come from these (`step_timings`), for live runs and the simulator alike.

    A step runs: [TP switch] rollout, until the round's end; then it waits for its last rewards;
    then for its training (the micro-batches not yet trained, the optimizer step); then it syncs
    the weights to the engine.  Training can run under the rollout and the reward wait: only what is
    left after the last reward is exposed."""

    start: float
    round_end: float
    """The round's end: its P-th group complete and its aborted tail back (simulated: every instance idle)."""
    rewards_done: float
    """When the step's last reward answer came (at or before `round_end`: the step waited for none after it)."""
    end: float
    """The step's end: its optimizer step done and the weights synced."""
    tp_switch_s: float = 0.0
    """Seconds to switch the rollout's TP before the round (only the simulator switches)."""
    sync_s: float = 0.0
    """Seconds to give the new weights to the engine, the step's last stage (the simulator has none)."""
    train_spans: tuple[tuple[float, ...], ...] = ()
    """(start, end, ...) of each trainer job of the step (micro-batches and the optimizer step), in order."""

    def __attrs_post_init__(self) -> None:
        marks = {"start + tp_switch_s": self.start + self.tp_switch_s, "round_end": self.round_end,
                 "rewards wait's end": max(self.round_end, self.rewards_done), "end - sync_s": self.end - self.sync_s,
                 "end": self.end}
        names = list(marks)
        if self.tp_switch_s < 0 or self.sync_s < 0:
            raise ValueError(f"step times: negative tp_switch_s {self.tp_switch_s} or sync_s {self.sync_s}")
        for a, b in zip(names, names[1:]):  # (a clock's marks less its durations may be an ulp apart)
            if marks[b] < marks[a] - 1e-9 * max(1.0, abs(marks[a])):
                raise ValueError(f"step times out of order: {b} = {marks[b]} before {a} = {marks[a]}")
        for span in self.train_spans:
            if span[1] < span[0]:
                raise ValueError(f"step times: a trainer span ends before it starts: {span}")


def step_timings(times: StepTimes) -> dict[str, float]:
    """The step's timing fields, one definition each (docs/reference-trainer.md, "A step's record"):

    rollout_s           the rollout: from its start (after a TP switch) to the round's end
    reward_s            the reward wait the step shows: from the round's end to its last reward (0 when
                        every reward came before the round ended)
    train_s             all the trainer's busy seconds (micro-batches and the optimizer step)
    train_overlapped_s  the trainer's busy seconds before the round's end (hidden under the rollout)
    train_exposed_s     the training the step waits for: from the reward wait's end to the trainer done
                        (the optimizer step's end; the step's end less its sync)
    sync_s              weights to the engine
    step_s              the whole step = tp_switch_s + rollout_s + reward_s + train_exposed_s + sync_s
    tp_switch_s         the rollout TP's switch before the round
    """
    reward_end = max(times.round_end, times.rewards_done)
    overlapped, after = split_training(times.train_spans, times.round_end)
    return {
        "rollout_s": times.round_end - (times.start + times.tp_switch_s),
        "reward_s": reward_end - times.round_end,
        "train_s": overlapped + after,
        "train_overlapped_s": overlapped,
        "train_exposed_s": max(0.0, (times.end - times.sync_s) - reward_end),
        "sync_s": times.sync_s,
        "step_s": times.end - times.start,
        "tp_switch_s": times.tp_switch_s,
    }


def step_record(report: RoundReport, times: StepTimes, occupancy: Occupancy, capacity: int, **fields) -> dict:
    """The per-step metrics record (same names in the simulator's JSON and the trainer's JSONL): the
    round's counts, the timings of `step_timings`, the rollout's bubble ratio (`occupancy` against
    `capacity` until the round's end), then the backend's own `fields`."""
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
    record.update(step_timings(times))
    record["bubble_ratio"] = occupancy.bubble_ratio(capacity, times.round_end)
    record.update(fields)
    return record
