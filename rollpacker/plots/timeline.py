"""One step's timeline as a picture that reads at 10 requests or 10,000: occupancy, not bars.

    top        requests in flight against capacity over the step (the trainer counts what it launched,
               queued in the engine or running; the simulator what runs), per engine when at most
               `MAX_ENGINE_PANELS` engines, else summed over all of them (the red area between the
               two is the bubble); the round's end is a dashed line, what follows it (reward and
               training, the engines idle) is shaded grey; aborts are red ticks along the top
    heatmap    with more engines than panels: each engine's occupancy (running / capacity) per time bin
    training   when the step has training spans: the trainer's lane (each micro-batch and the optimizer
               step as it ran), on the same time axis, so training under the rollout and training
               the step waits for after the round's end read apart
    tokens     the step's generated tokens split into kept / aborted / not trained / carried (the
               record's wasted tokens are aborted + not trained, as the caption says)
    requests   one bar per request, only when the step has at most `MAX_REQUEST_ROWS` of them

The figure's size does not depend on the number of requests.  Both the reference trainer
(`RunDir.plot_timeline`) and the simulator (`rollpacker simulate --plot`) build a `StepTimeline`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from attrs import field, frozen

MAX_ENGINE_PANELS = 4
MAX_REQUEST_ROWS = 64
HEATMAP_BINS = 300
TRAIN_COLORS = ("tab:green", "yellowgreen")
"""Consecutive micro-batches alternate between these; the optimizer step is dark green."""
TOKEN_COLORS = {"kept": "tab:green", "aborted": "tab:red", "wasted": "tab:orange", "carried": "tab:purple"}
TOKEN_LABELS = {"kept": "kept", "aborted": "aborted", "wasted": "not trained", "carried": "carried"}
"""A token fate's name on the plot: the record's wasted_tokens is aborted + not trained, and the plot
says so ("wasted" alone named only the second part, a smaller number than the title's)."""
TOKEN_MEANS = {"kept": "trained this step",
               "aborted": "wasted: cut off mid-response (over-launched, or the tail at the round's end)",
               "wasted": "wasted: finished, not trained (beyond R, or deferred to a long round)",
               "carried": "kept for a later step (partial rollouts)"}
"""What each token fate means, in the token bar's legend."""
REQUEST_COLORS = {**TOKEN_COLORS, "running": "tab:gray"}


@frozen
class EngineTrace:
    """Requests running on one engine: `running[i]` from `times[i]` until `times[i + 1]` (the last
    until the step's end)."""

    name: str
    times: tuple[float, ...]
    running: tuple[int, ...]
    capacity: int

    @classmethod
    def from_spans(cls, name: str, spans: Sequence[tuple[float, float | None]], capacity: int, end: float):
        """From (start, end) of each request; an end of None means still running at `end`."""
        deltas = sorted([(s, 1) for s, _ in spans] + [(e if e is not None else end, -1) for _, e in spans])
        times, running, level = [0.0], [0], 0
        for at, step in deltas:
            level += step
            if at == times[-1]:
                running[-1] = level
            else:
                times.append(at)
                running.append(level)
        return cls(name, tuple(times), tuple(running), capacity)

    def mean_running(self, edges: np.ndarray) -> np.ndarray:
        """Time-averaged running requests in each bin between consecutive `edges`."""
        t = np.asarray(self.times + (max(edges[-1], self.times[-1]),), dtype=float)
        area = np.concatenate([[0.0], np.cumsum(np.diff(t) * np.asarray(self.running, dtype=float))])
        at_edges = np.interp(edges, t, area)
        return np.diff(at_edges) / np.maximum(np.diff(edges), 1e-12)


@frozen
class StepTimeline:
    title: str
    engines: tuple[EngineTrace, ...]
    round_end: float
    """Seconds from the step's start to the round's end (the rollout)."""
    step_end: float
    """Seconds from the step's start to its end (after reward and training)."""
    aborts: tuple[tuple[float, int], ...] = ()
    """(time, engine index) of each aborted request."""
    tokens: Mapping[str, int] = field(factory=dict)
    """Generated tokens by fate, keys of TOKEN_COLORS."""
    requests: tuple[tuple[float, float | None, str], ...] | None = None
    """(start, end, outcome) per request, for the per-request view of a small step."""
    training: tuple[tuple[float, float, str], ...] = ()
    """(start, end, what) of each trainer job (micro-batches, the optimizer step): the training lane."""


def step_to_draw(records: Sequence[Mapping]) -> tuple[int, str]:
    """The step whose timeline shows the policy at work, and why it is that one, from the steps'
    records (metrics.jsonl): the one that cut the most tokens from its rollout (`wasted_tokens`: the
    short rounds of tail batching, the aborts of sorted and partial), else (sync, or a run whose
    rounds all ran to the end) the slowest.  Ties go to the earlier step, so adding a record moves the
    choice to that step or leaves it where it was: a run can draw each step as it ends and keep the
    picture only when the new step is chosen."""
    cut = [r for r in records if r.get("wasted_tokens", 0) > 0]
    if cut:
        best = max(cut, key=lambda r: r["wasted_tokens"])
        return best["step"], (f"the step that cut the most tokens from its rollout "
                              f"({best['wasted_tokens']:,} of {best.get('generated_tokens', 0):,} wasted)")
    slowest = max(records, key=lambda r: r.get("step_s", 0.0))
    return slowest["step"], "the slowest step (no step wasted any tokens)"


def total_trace(engines: Sequence[EngineTrace]) -> EngineTrace:
    """All engines summed into one trace."""
    times = sorted({t for e in engines for t in e.times} | {0.0})
    running = [0] * len(times)
    for e in engines:
        at = np.searchsorted(e.times, times, side="right") - 1
        for i, j in enumerate(at):
            running[i] += e.running[j] if j >= 0 else 0
    return EngineTrace(f"all {len(engines)} engines", tuple(times), tuple(running), sum(e.capacity for e in engines))


def plot_step_timeline(timeline: StepTimeline, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig = draw_step_timeline(timeline)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return Path(path)


def draw_step_timeline(timeline: StepTimeline):
    """The figure of `plot_step_timeline` (a matplotlib Figure, the caller closes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    many = len(timeline.engines) > MAX_ENGINE_PANELS
    traces = [total_trace(timeline.engines)] if many else list(timeline.engines)
    show_requests = timeline.requests is not None and 0 < len(timeline.requests) <= MAX_REQUEST_ROWS
    show_training = bool(timeline.training)
    heights = ([2.2] * len(traces) + ([1.8] if many else []) + ([0.8] if show_training else []) + [0.7]
               + ([2.6] if show_requests else []))
    fig, axes = plt.subplots(len(heights), 1, figsize=(11, 1.0 + sum(heights)),
                             gridspec_kw={"height_ratios": heights})
    axes = list(np.atleast_1d(axes))
    for k, trace in enumerate(traces):
        _occupancy(axes[k], trace, timeline, engine=None if many else k)
    at = len(traces)
    if many:
        _heatmap(fig, axes[at], timeline)
        at += 1
    if show_training:
        _training(axes[at], timeline)
        at += 1
    _tokens(axes[at], timeline.tokens)
    if show_requests:
        _requests(axes[at + 1], timeline)
    else:
        axes[at - 1].set_xlabel("seconds since the step began")
    for ax in axes[: at] + ([axes[-1]] if show_requests else []):
        ax.set_xlim(0, timeline.step_end or 1.0)
    axes[0].set_title(timeline.title, fontsize=10)
    fig.tight_layout()
    return fig


def _occupancy(ax, trace: EngineTrace, timeline: StepTimeline, engine: int | None) -> None:
    # the round's end is a point of its own, so the bubble's area stops exactly there
    t = np.union1d(trace.times, [timeline.round_end, timeline.step_end])
    r = np.asarray(trace.running, dtype=float)[np.searchsorted(trace.times, t, side="right") - 1]
    ax.fill_between(t, 0, r, step="post", color="tab:blue", alpha=0.8, lw=0, label="requests in flight")
    inside = t <= timeline.round_end
    ax.fill_between(t, np.minimum(r, trace.capacity), trace.capacity, where=inside, step="post", color="tab:red",
                    alpha=0.25, lw=0, label="bubble (idle capacity)")
    ax.axhline(trace.capacity, color="black", lw=1, label=f"capacity {trace.capacity}")
    ax.axvline(timeline.round_end, color="black", ls="--", lw=1, label="round end")
    if timeline.step_end > timeline.round_end:
        ax.axvspan(timeline.round_end, timeline.step_end, color="grey", alpha=0.15, lw=0, label="reward + training")
    aborts = [a for a, e in timeline.aborts if engine is None or e == engine]
    if aborts:
        top = max(trace.capacity, max(trace.running)) * 1.05
        ax.plot(aborts, [top] * len(aborts), "|", color="tab:red", ms=7, alpha=0.6,
                label=f"{len(aborts)} aborts")
    ax.set_ylim(0, max(trace.capacity, max(trace.running)) * 1.12)
    ax.set_ylabel(f"in flight\n{trace.name}", fontsize=8)
    if engine in (None, 0):
        ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7, frameon=False)


def _heatmap(fig, ax, timeline: StepTimeline) -> None:
    edges = np.linspace(0.0, timeline.step_end or 1.0, HEATMAP_BINS + 1)
    share = np.stack([e.mean_running(edges) / max(e.capacity, 1) for e in timeline.engines])
    image = ax.imshow(share, aspect="auto", origin="lower", cmap="Blues", vmin=0, vmax=1, interpolation="nearest",
                      extent=(0, edges[-1], -0.5, len(timeline.engines) - 0.5))
    ax.axvline(timeline.round_end, color="black", ls="--", lw=1)
    ax.set_ylabel("engine", fontsize=8)
    fig.colorbar(image, ax=ax, pad=0.01, label="occupancy")


def _training(ax, timeline: StepTimeline) -> None:
    from rollpacker.core.metrics import split_training

    for k, (start, end, what) in enumerate(timeline.training):
        color = "darkgreen" if not what.startswith("micro-batch") else TRAIN_COLORS[k % len(TRAIN_COLORS)]
        ax.barh(0, end - start, left=start, color=color, height=0.8)
    overlapped, after = split_training(timeline.training, timeline.round_end)
    ax.axvline(timeline.round_end, color="black", ls="--", lw=1)
    ax.set_yticks([])
    ax.set_ylabel("trainer", fontsize=8)
    handles = [_patch(TRAIN_COLORS[0]), _patch(TRAIN_COLORS[1]), _patch("darkgreen")]
    ax.legend(handles, ["micro-batch", "next micro-batch", "optimizer step"], loc="center left",
              bbox_to_anchor=(1.005, 0.5), fontsize=6.5, frameon=False, ncol=1, handlelength=1.0,
              title=f"{len(timeline.training)} jobs: {overlapped:.1f} s in the rollout, {after:.1f} s after",
              title_fontsize=6.5, alignment="left")


def _tokens(ax, tokens: Mapping[str, int]) -> None:
    total = sum(tokens.values())
    left = 0
    for name, color in TOKEN_COLORS.items():
        n = tokens.get(name, 0)
        if n <= 0:
            continue
        ax.barh(0, n, left=left, color=color, height=0.8)
        share = n / total
        label = f"{TOKEN_LABELS[name]} {n:,} ({share:.0%})"
        if share > 0.0125 * len(label):  # written inside its segment only where it fits (the legend names it)
            ax.text(left + n / 2, 0, label, ha="center", va="center", fontsize=8)
        left += n
    ax.set_xlim(0, max(total, 1))
    ax.set_yticks([])
    shown = [name for name in TOKEN_COLORS if tokens.get(name, 0) > 0]
    ax.legend([_patch(TOKEN_COLORS[n]) for n in shown], [f"{TOKEN_LABELS[n]}: {TOKEN_MEANS[n]}" for n in shown],
              loc="center left", bbox_to_anchor=(1.005, 0.5), fontsize=6.5, frameon=False, handlelength=1.0)
    ax.set_xlabel(token_line(tokens), fontsize=8)


def token_line(tokens: Mapping[str, int]) -> str:
    """The token bar's caption, its wasted figure the record's (aborted + not trained)."""
    aborted, unused = tokens.get("aborted", 0), tokens.get("wasted", 0)
    parts = [f"kept {tokens.get('kept', 0):,}",
             f"wasted {aborted + unused:,} (aborted {aborted:,} + not trained {unused:,})"]
    if tokens.get("carried", 0):
        parts.append(f"carried {tokens['carried']:,}")
    return f"generated tokens this step: {sum(tokens.values()):,}: " + ", ".join(parts)


def _requests(ax, timeline: StepTimeline) -> None:
    for row, (start, end, outcome) in enumerate(timeline.requests):
        stop = end if end is not None else timeline.round_end
        ax.barh(row, stop - start, left=start, color=REQUEST_COLORS.get(outcome, "tab:gray"), height=0.8)
    handles = [_patch(c) for c in REQUEST_COLORS.values()]
    ax.legend(handles, [TOKEN_LABELS.get(k, k) for k in REQUEST_COLORS], loc="lower right", fontsize=7, ncol=5)
    ax.set_ylabel("request", fontsize=8)
    ax.set_xlabel("seconds since the step began")


def _patch(color: str):
    import matplotlib.pyplot as plt

    return plt.Rectangle((0, 0), 1, 1, color=color)
