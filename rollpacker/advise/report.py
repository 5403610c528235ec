"""The advice as text (a short table, the recommendation as flags), as JSON, and as a plot."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .search import Outcome, recommend


def span(values, fmt: str, point: bool, unit: str = "") -> str:
    """median (min-max), or only min-max where the advice may give no point (tier 2)."""
    lo, hi = min(values), max(values)
    if not point:
        return f"{lo:{fmt}}-{hi:{fmt}}{unit}"
    mid = float(np.median(values))
    return f"{mid:{fmt}}{unit}" if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{mid:{fmt}}{unit} ({lo:{fmt}}-{hi:{fmt}})"


def table(results: list[Outcome], point: bool) -> list[str]:
    head = ("policy", "whole step gain", "rollout gain", "wasted tokens", "kept length / sync's", "on-policy")
    rows = [head] + [(o.candidate.label, span(o.step_gain, ".2f", point, "x"), span(o.rollout_gain, ".2f", point, "x"),
                      span(o.wasted, ".0%", point), span(o.kept_length, ".3f", point), span(o.on_policy, ".0%", point))
                     for o in results]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]


def recommendation(results: list[Outcome], point: bool) -> list[str]:
    best = recommend(results)
    if best is None:
        return ["Recommendation: keep sync (no on-policy setting gains 5% of the whole step on this workload)."]
    lines = [f"Recommendation: {best.candidate.label}, whole step {span(best.step_gain, '.2f', point, 'x')}, rollout "
             f"{span(best.rollout_gain, '.2f', point, 'x')} faster than sync:",
             f"    {best.candidate.flags()}"]
    fastest = max(results, key=lambda o: float(np.median(o.step_gain)))
    if fastest is not best and float(np.median(fastest.step_gain)) > float(np.median(best.step_gain)):
        lines.append(f"(faster but off-policy: {fastest.candidate.label}, {span(fastest.step_gain, '.2f', point, 'x')}, "
                     f"{span(fastest.on_policy, '.0%', point)} of its tokens on-policy: {fastest.candidate.flags()})")
    return lines


def plot(results: list[Outcome], title: str, out: Path, point: bool = True) -> Path:
    """Each policy's whole-step and rollout gain over sync: the median with min-max whiskers, or (tier 2,
    `point` False) a bar spanning the range alone."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [o for o in results if o.candidate.policy != "sync"]
    y = np.arange(len(shown))
    fig, ax = plt.subplots(figsize=(7.5, 0.55 * len(shown) + 1.6))
    for offset, key, label in ((-0.18, "step_gain", "whole step"), (0.18, "rollout_gain", "rollout")):
        values = [getattr(o, key) for o in shown]
        if point:
            mid = np.array([np.median(v) for v in values])
            err = np.array([[m - min(v) for m, v in zip(mid, values)], [max(v) - m for m, v in zip(mid, values)]])
            ax.barh(y + offset, mid, height=0.34, xerr=err, capsize=3, label=label)
        else:
            lo = np.array([min(v) for v in values])
            ax.barh(y + offset, np.array([max(v) for v in values]) - lo, left=lo, height=0.34, label=label)
    ax.axvline(1.0, color="k", lw=0.8, ls="--")
    ax.set_yticks(y, [o.candidate.label for o in shown])
    ax.invert_yaxis()
    ax.set_xlabel("gain over sync (x): " + ("median, whiskers min-max over the runs" if point else
                                            "the range over the assumed prompt structures and seeds"))
    ax.set_title(title, fontsize=9)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=2, fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
