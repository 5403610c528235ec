"""The pre-registered test of benchmarks/fidelity.py's `tost` settings: does tail batching learn like
sync?  Two one-sided tests (TOST) on paired seed differences of one primary metric.

- Primary metric of a run: its sampled held-out reward (`eval_sampled_reward`: the held-out set sampled
  as the run samples) averaged over every evaluation after training began (step > 0; the evaluations
  before the first step are the same weights scored the same way in both runs of a pair, so they would
  only pull the difference towards zero).
- A pair: sync and tail of the same --seed (the same data order, initial weights and held-out set).
- Equivalence within +-MARGIN is shown when both one-sided tests reject at ALPHA, which is the same as the
  (1 - 2 ALPHA) t-interval of the mean paired difference lying inside +-MARGIN; otherwise "not shown".
- The control: sync against sync of another seed (its difference is what a change of seed alone makes).

Made from the committed metrics alone (benchmarks/fidelity/SETTING/...); scipy gives the t distribution."""

from __future__ import annotations

import statistics

from attrs import frozen

MARGIN = 0.10
"""Equivalence margin on the primary metric (reward in [0, 1])."""
ALPHA = 0.05
"""Level of each one-sided test."""
KEY = "eval_sampled_reward"


def primary(evals: list[dict], upto: int | None = None) -> float | None:
    """The primary metric of one run: the mean sampled held-out reward over its evaluations after step 0
    (those at most `upto` steps, None: all); None without any."""
    values = [e[KEY] for e in evals if e["step"] > 0 and KEY in e and (upto is None or e["step"] <= upto)]
    return statistics.fmean(values) if values else None


@frozen
class Tost:
    """Two one-sided tests of `differences` (one per pair) against +-margin."""

    differences: tuple[float, ...]
    margin: float = MARGIN
    alpha: float = ALPHA
    planned: int = 0
    """The pre-registered number of pairs: fewer is an interim look, worded without a verdict."""

    @property
    def n(self) -> int:
        return len(self.differences)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.differences)

    @property
    def se(self) -> float:
        return statistics.stdev(self.differences) / self.n ** 0.5 if self.n > 1 else float("inf")

    def interval(self) -> tuple[float, float]:
        """The (1 - 2 alpha) t-interval of the mean difference (90% at alpha 0.05)."""
        from scipy import stats

        if self.n < 2:
            return (float("-inf"), float("inf"))
        half = stats.t.ppf(1 - self.alpha, self.n - 1) * self.se
        return (self.mean - half, self.mean + half)

    def p_value(self) -> float:
        """The larger of the two one-sided p-values (H0: mean <= -margin; H0: mean >= +margin)."""
        from scipy import stats

        if self.n < 2 or self.se == 0:
            return 0.0 if self.n > 1 and abs(self.mean) < self.margin else 1.0
        lower = stats.t.sf((self.mean + self.margin) / self.se, self.n - 1)
        upper = stats.t.cdf((self.mean - self.margin) / self.se, self.n - 1)
        return max(lower, upper)

    @property
    def equivalent(self) -> bool:
        return self.p_value() < self.alpha

    def verdict(self) -> str:
        low, high = self.interval()
        interval = f"{100 * (1 - 2 * self.alpha):.0f}% interval [{low:+.3f}, {high:+.3f}]"
        figures = f"mean paired difference {self.mean:+.3f} over {self.n} seed pair(s), {interval}, TOST p = {self.p_value():.3f}"
        if self.n < self.planned:
            return f"interim, {self.n} of {self.planned} pre-registered pairs: no verdict until all are in ({figures})"
        if self.equivalent:
            return f"equivalent within +-{self.margin:.2f} ({figures})"
        return f"equivalence within +-{self.margin:.2f} not shown ({figures})"


def paired(per_run: dict[tuple[str, int], float], policy: str, against: str = "sync") -> list[tuple[int, float]]:
    """(seed, primary[policy] - primary[against]) for every seed that has both runs."""
    return [(seed, value - per_run[(against, seed)]) for (name, seed), value in sorted(per_run.items())
            if name == policy and (against, seed) in per_run]


def control(per_run: dict[tuple[str, int], float], seeds: tuple[int, int]) -> float | None:
    """sync of seeds[1] - sync of seeds[0]: the difference a change of seed alone makes."""
    a, b = (per_run.get(("sync", s)) for s in seeds)
    return None if a is None or b is None else b - a


def design_text(setting: str, seeds: list[int], steps: int, eval_every: int, control_seeds: tuple[int, int]) -> str:
    """The pre-registered design, as RESULTS.md states it before the runs."""
    return (f"Pre-registered design (written before the runs of setting `{setting}`): primary metric, a run's "
            f"sampled held-out reward (the fixed held-out set, sampled with the run's --temperature and --top-p) "
            f"averaged over every evaluation after step 0 (every {eval_every} steps to step {steps}); pairs, sync and "
            f"tail of the same --seed ({', '.join(map(str, seeds))}); test, two one-sided t-tests on the paired "
            f"differences (tail - sync) at alpha {ALPHA} each, equivalence margin +-{MARGIN:.2f}; result worded "
            f"\"equivalent within +-{MARGIN:.2f}\" only if both reject, else \"not shown\"; control, sync seed "
            f"{control_seeds[1]} - sync seed {control_seeds[0]} (the noise a seed alone makes). Nothing is dropped "
            f"after the fact: a pair missing a run is reported as missing.")


def plot(curves, per_run: dict[tuple[str, int], float], test: Tost, path, steps: int) -> None:
    """Left: each run's sampled held-out reward against step (one colour per seed; sync solid, tail
    dashed), the evaluation window shaded.  Right: each pair's difference of the primary metric, their
    mean with its interval, and the margin."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [2, 1]})
    seeds = sorted({c.seed for c in curves})
    colours = plt.get_cmap("tab10")
    for c in curves:
        evals = [e for e in c.evals if KEY in e]
        left.plot([e["step"] for e in evals], [e[KEY] for e in evals], marker=".",
                  color=colours(seeds.index(c.seed) % 10), linestyle="-" if c.policy == "sync" else "--",
                  label=f"{c.policy} seed {c.seed}")
    left.axvspan(0.5, steps, color="0.92", zorder=0, label="evaluation window (primary metric)")
    left.set_xlabel("optimizer steps")
    left.set_ylabel("held-out reward, sampled as trained")
    left.legend(fontsize=7, ncol=2)
    pairs = paired(per_run, "tail")
    right.axhspan(-test.margin, test.margin, color="tab:green", alpha=0.12, label=f"margin +-{test.margin:.2f}")
    right.axhline(0, color="0.5", linewidth=0.8)
    right.scatter(range(len(pairs)), [d for _, d in pairs], color="tab:orange", label="tail - sync, per seed")
    if test.n:
        low, high = test.interval()
        x = len(pairs)
        right.errorbar([x], [test.mean], yerr=[[test.mean - max(low, -1)], [min(high, 1) - test.mean]], fmt="o",
                       color="black", capsize=5, label=f"mean, {100 * (1 - 2 * test.alpha):.0f}% interval")
    right.set_xticks(range(len(pairs) + 1), [f"seed {s}" for s, _ in pairs] + ["mean"])
    right.set_ylabel("difference of the primary metric")
    right.set_title(test.verdict().split(" (")[0], fontsize=9)
    right.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def section_lines(curves, setting: dict, steps: int, plot_path) -> list[str]:
    """The design (as pre-registered), the test's result on the runs there are, and the control, for
    the RESULTS.md section; draws the plot.  `curves`: fidelity_report.Curve of every run."""
    seeds = sorted({c.seed for c in curves if c.policy == "sync"} | set(setting.get("seeds", [])))
    flags = setting.get("flags", [])
    every = int(flags[flags.index("--eval-every") + 1]) if "--eval-every" in flags else 0
    control_seeds = tuple(setting.get("control", (0, 1)))
    done = {(c.policy, c.seed): c for c in curves if len(c.steps) >= steps}
    per_run = {key: value for key, c in done.items() if (value := primary(c.evals, steps)) is not None}
    lines = [design_text(setting.get("setting", "?"), seeds, steps, every, control_seeds), ""]
    sets = {e.get("eval_set") for c in curves for e in c.evals}
    if len(sets) > 1:
        lines.append(f"**Warning**: the runs were scored on {len(sets)} different held-out sets ({sorted(map(str, sets))}).")
    for policy in sorted({p for p, _ in per_run} - {"sync"}):
        pairs = paired(per_run, policy)
        test = Tost(tuple(d for _, d in pairs), planned=len(setting.get("seeds", [])))
        each = ", ".join(f"seed {s} {d:+.3f}" for s, d in pairs)
        result = test.verdict() if test.n >= 2 else f"{test.n} complete pair(s): no test yet"
        lines.append(f"- **{policy} - sync**: {result}. Per seed: {each or 'none'}.")
        if policy == "tail" and plot_path is not None:
            plot(curves, per_run, test, plot_path, steps)
    missing = sorted(f"{c.policy} seed {c.seed} ({len(c.steps)} of {steps} steps)" for c in curves
                     if len(c.steps) < steps)
    if missing:
        lines.append(f"- Runs not complete (not in the test): {', '.join(missing)}.")
    gap = control(per_run, control_seeds)
    lines.append(f"- Control, sync seed {control_seeds[1]} - sync seed {control_seeds[0]}: "
                 + ("not both complete yet." if gap is None else f"{gap:+.3f}."))
    if per_run:
        lines.append("- Primary metric per run: " + "; ".join(f"{p} seed {s} {v:.3f}" for (p, s), v in sorted(per_run.items())) + ".")
    return lines if curves else lines[:1]
