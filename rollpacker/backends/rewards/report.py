"""What the reward executor reports per step: `RewardStepReport`, counted in a `StepStats`."""

from __future__ import annotations

import math

from attrs import define, field, frozen

FAILURE_KINDS = ("raised", "bad_value", "timeout", "worker_died")
"""Why a scorer failed (the pool's module docstring); the keys of `RewardStepReport.failures_by_kind`."""


def nonfinite_metrics_line(counts: dict[str, int]) -> str:
    """The warning for metrics (name -> values) a scorer returned as NaN or inf."""
    names = ", ".join(f"{key!r} ({n}x)" for key, n in sorted(counts.items()))
    return (f"warning: the reward function returned NaN or inf for metric {names}: left out of its "
            f"reward_metric_ mean, counted in reward_num_nonfinite_metrics of metrics.jsonl (later ones are "
            f"not printed)")


@frozen
class RewardStepReport:
    """What the executor did since the previous report."""

    num_scored: int
    """Outcomes with status "ok"."""
    num_failed: int
    """Outcomes with status "error", "nan" or "timeout"."""
    num_timed_out: int
    num_errors: int
    num_nan: int
    queue_s_mean: float
    queue_s_max: float
    latency_s_mean: float
    num_workers_replaced: int
    metrics: dict = field(factory=dict)
    """Mean of each metric a dict-returning scorer reported, over the "ok" outcomes that had it
    finite."""
    nonfinite_metrics: dict = field(factory=dict)
    """Metric name -> how many of its values were NaN or inf (left out of its mean in `metrics`)."""
    num_nonfinite_metrics: int = 0
    """The sum of `nonfinite_metrics`: a step record's `reward_num_nonfinite_metrics`."""
    failures_by_kind: dict = field(factory=dict)
    """Failures per kind, every one of `FAILURE_KINDS` (0 when none)."""
    first_errors: dict = field(factory=dict)
    """Kind -> the first error of that kind since the previous report (one line)."""


@define(eq=False)
class StepStats:
    """What the executor counts between two reports."""

    ok: int = 0
    error: int = 0
    nan: int = 0
    timeout: int = 0
    replaced: int = 0
    kinds: dict[str, int] = field(factory=lambda: dict.fromkeys(FAILURE_KINDS, 0))
    first_errors: dict[str, str] = field(factory=dict)
    queue_s: list[float] = field(factory=list)
    latency_s: list[float] = field(factory=list)
    metric_sums: dict[str, list[float]] = field(factory=dict)
    """Metric name -> [sum, count] over "ok" outcomes."""
    nonfinite: dict[str, int] = field(factory=dict)
    """Metric name -> its NaN or inf values, counted instead of summed."""

    def count(self, status: str, kind: str, error: str, metrics: dict[str, float], queue_s: float,
              latency: float) -> None:
        """One request's outcome: its status ("ok", "error", "nan", "timeout"), failure kind and line."""
        setattr(self, status, getattr(self, status) + 1)
        if kind:
            self.kinds[kind] += 1
            self.first_errors.setdefault(kind, error)
        self.add_metrics(metrics)
        self.queue_s.append(queue_s)
        self.latency_s.append(latency)

    def add_metrics(self, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            if not math.isfinite(value):
                self.nonfinite[key] = self.nonfinite.get(key, 0) + 1
                continue
            acc = self.metric_sums.setdefault(key, [0.0, 0])
            acc[0] += value
            acc[1] += 1

    def metric_means(self) -> dict[str, float]:
        return {key: total / count for key, (total, count) in sorted(self.metric_sums.items())}

    def report(self) -> RewardStepReport:
        """The report of these counts."""
        q, lat = self.queue_s, self.latency_s
        return RewardStepReport(
            num_scored=self.ok,
            num_failed=self.error + self.nan + self.timeout,
            num_timed_out=self.timeout,
            num_errors=self.error,
            num_nan=self.nan,
            queue_s_mean=sum(q) / len(q) if q else 0.0,
            queue_s_max=max(q) if q else 0.0,
            latency_s_mean=sum(lat) / len(lat) if lat else 0.0,
            num_workers_replaced=self.replaced,
            metrics=self.metric_means(),
            nonfinite_metrics=self.nonfinite,
            num_nonfinite_metrics=sum(self.nonfinite.values()),
            failures_by_kind=self.kinds,
            first_errors=self.first_errors,
        )
