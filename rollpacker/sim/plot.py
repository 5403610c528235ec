"""`--plot OUT.png`: one step's timeline in OUT.png and the run's step summary in OUT-summary.png,
drawn by rollpacker.plots like the reference trainer's (occupancy against capacity per instance,
not a bar per request, so it reads at thousands of requests)."""

from __future__ import annotations

from pathlib import Path

from rollpacker.plots.summary import plot_step_summary
from rollpacker.plots.timeline import EngineTrace, StepTimeline, plot_step_timeline


def summary_path(out: Path) -> Path:
    return out.with_name(out.stem + "-summary" + out.suffix)


def instance_trace(index: int, intervals, capacity: int, t0: float) -> EngineTrace:
    """An instance's (start, end, running, kind) segments as running requests over time; the gaps
    between segments are idle (0 running)."""
    times, running = [0.0], [0]
    for start, end, batch, _kind in intervals:
        for at, level in ((start - t0, batch), (end - t0, 0)):
            if at == times[-1]:
                running[-1] = level
            else:
                times.append(at)
                running.append(level)
    return EngineTrace(f"instance {index}", tuple(times), tuple(running), capacity)


def step_timeline(result: dict, timeline: dict, step: int) -> StepTimeline:
    rec = result["steps"][step]
    t0 = timeline["start"]
    per_instance = -(-timeline["capacity"] // max(len(timeline["intervals"]), 1))  # the bubble's Q, split evenly
    engines = tuple(instance_trace(i, spans, per_instance, t0) for i, spans in timeline["intervals"].items())
    aborted = sum(tokens for _, _, tokens in timeline["aborts"])
    tokens = {"kept": rec["kept_tokens"], "aborted": aborted, "wasted": max(0, rec["wasted_tokens"] - aborted),
              "carried": rec.get("carried_tokens", 0)}
    return StepTimeline(
        title=f"{result['config']['policy']} step {step} ({rec['round']} round): {rec['launched_requests']} requests "
              f"on {len(engines)} instances, rollout {rec['rollout_s']:.1f} s (lower bound "
              f"{rec['lower_bound_rollout_s']:.1f} s), bubble {rec['bubble_ratio']:.1%}",
        engines=engines, round_end=rec["rollout_s"], step_end=rec["step_s"],
        aborts=tuple((at - t0, instance) for instance, at, _ in timeline["aborts"]), tokens=tokens)


def plot_run(result: dict, timelines: dict, step: int, out: Path) -> list[Path]:
    title = f"{result['config']['policy']}: P={result['config']['prompts']} R={result['config']['samples']}"
    return [plot_step_timeline(step_timeline(result, timelines[step], step), out),
            plot_step_summary(result["steps"], summary_path(out), title=title)]
