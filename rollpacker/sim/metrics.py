"""Per-step measurements of a simulated step and the run's totals (field names: core.metrics)."""

from __future__ import annotations

import numpy as np

from rollpacker.core import EndRound, Occupancy, RewardScored, StepOptimizer, StepTimes, step_record

from .bias import BIAS_SUMS, bias_means, bias_record

TAIL_SHARE = 0.1
"""Tail latency: the time the last 10% of a round's finished requests take (Seer's definition)."""

SUMMED = ("rollout_s", "reward_s", "train_s", "step_s", "tp_switch_s", "lower_bound_rollout_s", "floor_s",
          "generated_tokens", "kept_tokens", "wasted_tokens", "carried_tokens", "offpolicy_tokens",
          "trained_prompts", "deferred_prompts", "launched_requests", "retried_requests", "short_rounds",
          "long_rounds", "preemptions", "reward_timeouts", "train_busy_s", "tail_s") + BIAS_SUMS + (
          "train_overlapped_s", "train_exposed_s", "sync_s")


class StepMeter:
    """Collects one step's timings as the driver runs it."""

    def __init__(self, start: float, capacity: int) -> None:
        self.start = start
        self.capacity = capacity
        self.log = Occupancy()
        """Requests running over the instances until the round's end."""
        self.rollout_end: float | None = None
        self.report = None
        self.last_reward = start
        self.train_busy = 0.0
        self.train_spans: list[tuple[float, float]] = []
        self.aborts: list[tuple[int, float, int]] = []
        self.longest = 0
        self.peak_running = 0
        self.timeouts = 0
        self.tp, self.switch_s = 1, 0.0
        self.finish_times: list[float] = []
        self.kept_lengths: list[int] = []
        self.kept_segments: list = []
        self.launched_lengths: list[int] = []

    def occupancy(self, now: float, running: int, instances) -> None:
        if self.rollout_end is not None:
            return
        self.log.set(now, running)
        self.peak_running = max(self.peak_running, max(len(i.running) for i in instances))

    def request_ended(self, req) -> None:
        self.longest = max(self.longest, req.generated)

    def finished(self, at: float) -> None:
        self.finish_times.append(at)

    def tail_s(self) -> float:
        """Time from the finish of the 90th-percentile request to the round's end."""
        if not self.finish_times:
            return 0.0
        return self.rollout_end - float(np.quantile(self.finish_times, 1.0 - TAIL_SHARE))

    def kept_new_tokens(self) -> tuple[int, int]:
        """(tokens, longest response) of the kept samples, counting only this step's segments (the
        newest policy version: a resumed response's older segments were generated in earlier steps)."""
        if not self.kept_segments:
            return 0, 0
        version = max(seg.policy_version for segs in self.kept_segments for seg in segs)
        new = [sum(seg.num_tokens for seg in segs if seg.policy_version == version) for segs in self.kept_segments]
        return sum(new), max(new)

    def aborted(self, instance: int, at: float, tokens: int) -> None:
        self.aborts.append((instance, at, tokens))

    def reward(self, scored: RewardScored) -> None:
        self.last_reward = max(self.last_reward, scored.at)
        self.timeouts += int(scored.failed)

    def trained(self, start: float, seconds: float) -> None:
        """The trainer ran a micro-batch from `start` for `seconds`."""
        self.train_busy += seconds
        self.train_spans.append((start, start + seconds))

    def round_ended(self, cmd: EndRound, now: float) -> None:
        self.rollout_end, self.report = now, cmd.report

    def optimizer(self, cmd: StepOptimizer, now: float) -> None:
        self.last_reward = max(self.last_reward, now) if self.rollout_end is None else self.last_reward

    def times(self, start: float, optimizer_start: float, end: float) -> StepTimes:
        """The step's marks (from `start`, before any TP switch); the optimizer step runs from
        `optimizer_start` to `end`.  The simulator does not model the weight sync."""
        return StepTimes(start=start, round_end=self.rollout_end, rewards_done=self.last_reward, end=end,
                         tp_switch_s=self.switch_s, train_spans=(*self.train_spans, (optimizer_start, end)))

    def finish(self, sim, start: float, optimizer_start: float, end: float, ledger, pending) -> dict:
        """The step's record; `ledger` and `pending` are the driver's trained and still pending prompts."""
        rollout_end = self.rollout_end
        rollout_s = rollout_end - self.start
        cost, n = sim.cost, len(sim.instances)
        b_max = max(self.peak_running, 1)
        # lower_bound_*: the round's own work at its own TP and peak batch (not a floor: it moves with
        # the policy's configuration); floor_*: the policy-independent floor of floor.py.
        spec = sim.constants.spec  # its best case (one row, the best measured sibling share); 1.0 when off
        spec = spec.best_slowdown(cost) if spec.enabled else 1.0
        work_lb = self.report.generated_tokens * (cost.t1 + cost.t0 / b_max) / n * spec
        path_lb = self.longest * (cost.t0 + cost.t1) * spec
        floor_work, floor_path = sim.floor.bound(*self.kept_new_tokens())
        busy = sum(i.busy_s for i in sim.instances)
        if sim.record_timeline:
            sim.timelines[self.report.step] = {
                "start": self.start, "end": rollout_end,
                "intervals": {i.index: [(v.start, v.end, v.running, v.kind) for v in i.intervals or []]
                              for i in sim.instances},
                "capacity": self.capacity,
                "aborts": self.aborts}
        return step_record(
            self.report, self.times(start, optimizer_start, end), self.log, self.capacity,
            idle_ratio=max(0.0, 1.0 - busy / (n * rollout_s)) if rollout_s > 0 else 0.0,
            lower_bound_rollout_s=max(work_lb, path_lb),
            lower_bound_work_s=work_lb,
            lower_bound_path_s=path_lb,
            floor_s=max(floor_work, floor_path),
            floor_work_s=floor_work,
            floor_path_s=floor_path,
            tp=self.tp,
            instances=n,
            preemptions=sum(i.preemptions for i in sim.instances),
            peak_running=self.peak_running,
            longest_request=self.longest,
            reward_timeouts=self.timeouts,
            train_busy_s=self.train_busy,
            pending_prompts=len(pending),
            lost_prompts=ledger.lost(sim.launched_keys, pending),
            duplicate_prompts=ledger.duplicates,
            tail_s=self.tail_s(),
            tokens_per_s=self.report.generated_tokens / rollout_s if rollout_s > 0 else 0.0,
            **bias_record(self.kept_lengths, self.launched_lengths, sim.config.max_tokens),
        )


def totals(steps: list[dict]) -> dict:
    out = {key: sum(s[key] for s in steps) for key in SUMMED}
    rollout = out["rollout_s"]
    out["steps"] = len(steps)
    out["tp_switches"] = sum(1 for s in steps if s["tp_switch_s"] > 0)
    out["bubble_ratio"] = sum(s["bubble_ratio"] * s["rollout_s"] for s in steps) / rollout if rollout else 0.0
    out["idle_ratio"] = sum(s["idle_ratio"] * s["rollout_s"] for s in steps) / rollout if rollout else 0.0
    samples = sum(s["kept_tokens"] / s["mean_kept_length"] for s in steps if s["mean_kept_length"])
    out["mean_kept_length"] = out["kept_tokens"] / samples if samples else 0.0
    ended = sum(s["launched_requests"] for s in steps)
    out["mean_generated_length"] = (
        sum(s["mean_generated_length"] * s["launched_requests"] for s in steps) / ended if ended else 0.0)
    out["rollout_over_lower_bound"] = rollout / out["lower_bound_rollout_s"] if out["lower_bound_rollout_s"] else 0.0
    out["rollout_over_floor"] = rollout / out["floor_s"] if out["floor_s"] else 0.0
    out["mean_floor_s"] = out["floor_s"] / len(steps) if steps else 0.0
    out["mean_rollout_s"] = rollout / len(steps) if steps else 0.0
    out["mean_step_s"] = out["step_s"] / len(steps) if steps else 0.0
    out["tokens_per_s"] = out["generated_tokens"] / rollout if rollout else 0.0
    out["mean_tail_s"] = out["tail_s"] / len(steps) if steps else 0.0
    out.update(bias_means(out))
    out["on_policy_fraction"] = 1.0 - out["offpolicy_tokens"] / out["kept_tokens"] if out["kept_tokens"] else 1.0
    return out


EPOCH_STEP_SLACK = 4
"""An epoch run may take this many times the steps a sync run takes before it is refused (a safety cap)."""


def epoch_step_cap(config, dataset: int) -> int:
    """Most steps of an `epochs` run: EPOCH_STEP_SLACK x the steps sync needs, plus a few."""
    return EPOCH_STEP_SLACK * -(-config.epochs * dataset // config.prompts) + 8


def epoch_totals(total: dict, prompts: int, epoch_prompts: int, trained_keys: int) -> dict:
    """Per P trained prompts (a step's worth whatever the policy's rounds): the whole step and the
    rollout; with epochs, the run's seconds and the epochs' prompts left untrained (0 when done)."""
    batches = total["trained_prompts"] / prompts
    out = {"step_s_per_batch": total["step_s"] / batches if batches else 0.0,
           "rollout_s_per_batch": total["rollout_s"] / batches if batches else 0.0}
    if epoch_prompts:
        out |= {"epoch_s": total["step_s"], "untrained_prompts": epoch_prompts - trained_keys}
    return out
