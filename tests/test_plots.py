"""The plots read at any size: a step's timeline is as tall with 5,000 requests as with 500 (no bar
per request), the per-request view appears only for a small step, the bubble's area is the bubble
ratio's, and the summary draws 1,000 steps."""

from __future__ import annotations

import random

import attrs

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollpacker.plots.summary import plot_step_summary, wasted_share
from rollpacker.plots.timeline import (EngineTrace, StepTimeline, draw_step_timeline, plot_step_timeline, step_to_draw,
                                       total_trace)


def random_step(num_requests: int, engines: int, seed: int = 0) -> StepTimeline:
    rng = random.Random(seed)
    spans = [[] for _ in range(engines)]
    for i in range(num_requests):
        start = rng.uniform(0, 2)
        spans[i % engines].append((start, start + rng.expovariate(1 / 20)))
    end = max(e for s in spans for _, e in s)
    traces = tuple(EngineTrace.from_spans(f"e{k}", s, capacity=num_requests // engines, end=end)
                   for k, s in enumerate(spans))
    requests = tuple((s, e, "kept") for group in spans for s, e in group)
    return StepTimeline(title=f"{num_requests} requests", engines=traces, round_end=end, step_end=end * 1.2,
                        aborts=((1.0, 0), (3.0, 1 % engines)), tokens={"kept": 900, "aborted": 80, "wasted": 20},
                        requests=requests)


def png_shape(path) -> tuple[int, int]:
    import matplotlib.image

    return matplotlib.image.imread(path).shape[:2]


@pytest.mark.timeout(120)
def test_timeline_size_does_not_grow_with_requests(tmp_path):
    shapes = {n: png_shape(plot_step_timeline(random_step(n, engines=8), tmp_path / f"{n}.png")) for n in (500, 5000)}
    assert shapes[500] == shapes[5000]
    small = png_shape(plot_step_timeline(random_step(24, engines=1), tmp_path / "small.png"))
    large = png_shape(plot_step_timeline(random_step(800, engines=1), tmp_path / "large.png"))
    assert small[0] > large[0], "a small step adds its per-request view"
    assert max(small[0], shapes[5000][0]) < 1000, "every timeline fits a screen"


def test_from_spans_counts_requests_in_flight_and_the_total_sums_engines():
    trace = EngineTrace.from_spans("e", [(0.0, 2.0), (1.0, 3.0), (1.0, None)], capacity=4, end=5.0)
    assert trace.times == (0.0, 1.0, 2.0, 3.0, 5.0) and trace.running == (1, 3, 2, 1, 0)
    mean = trace.mean_running(np.array([0.0, 1.0, 3.0, 5.0]))
    assert mean.tolist() == [1.0, 2.5, 1.0]
    both = total_trace([trace, EngineTrace("f", (0.0, 2.0), (2, 0), 4)])
    assert both.capacity == 8 and both.running == (3, 5, 2, 1, 0)


@pytest.mark.timeout(120)
def test_summary_draws_a_thousand_steps_with_tokens_per_s_and_wasted_share(tmp_path):
    records = [{"step": i, "round": "long" if i % 5 == 4 else "short", "rollout_s": 10.0 + i % 5, "reward_s": 1.0,
                "train_s": 3.0, "generated_tokens": 1000, "wasted_tokens": 250 * (i % 2)} for i in range(1000)]
    assert wasted_share(records[1]) == 0.25
    path = plot_step_summary(records, tmp_path / "summary.png")
    assert png_shape(path)[0] < 1000


@pytest.mark.timeout(120)
def test_a_step_with_training_spans_draws_the_trainers_lane(tmp_path):
    step = random_step(24, engines=1)
    end = step.round_end
    spans = ((0.5, 4.0, "micro-batch 0"), (4.0, 9.0, "micro-batch 1"), (end + 1, end + 2, "optimizer step"))
    plain = png_shape(plot_step_timeline(step, tmp_path / "plain.png"))
    lane = png_shape(plot_step_timeline(attrs.evolve(step, training=spans), tmp_path / "lane.png"))
    assert lane[0] > plain[0] and lane[1] == plain[1], "one more lane, same width"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("requests", [24, 800])
def test_the_timeline_says_wasted_as_the_record_does_and_its_legends_overlap_nothing(requests):
    """The record's wasted_tokens is aborted + finished-not-trained: the token bar's caption says that
    figure (it said "wasted" for the second part alone); each fate and each shade of the trainer's lane
    has a legend entry; no legend or caption overlaps another panel, another legend or a caption."""
    import matplotlib.pyplot as plt

    step = random_step(requests, engines=1)
    end = step.round_end
    spans = ((0.5, 4.0, "micro-batch 0"), (4.0, 9.0, "micro-batch 1"), (end + 1, end + 2, "optimizer step"))
    fig = draw_step_timeline(attrs.evolve(step, training=spans, tokens={"kept": 411, "aborted": 510, "wasted": 79}))
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        trainer, tokens = fig.axes[1], fig.axes[2]
        assert "wasted 589 (aborted 510 + not trained 79)" in tokens.get_xlabel()
        assert not [t.get_text() for t in tokens.texts if t.get_text().startswith("wasted")]
        assert [t.get_text().split(":")[0] for t in tokens.get_legend().get_texts()] == ["kept", "aborted", "not trained"]
        assert [t.get_text() for t in trainer.get_legend().get_texts()] == ["micro-batch", "next micro-batch",
                                                                           "optimizer step"]
        boxes = [(f"axes {k}", ax.get_window_extent(renderer)) for k, ax in enumerate(fig.axes)]
        boxes += [(f"legend {k}", ax.get_legend().get_window_extent(renderer)) for k, ax in enumerate(fig.axes)
                  if ax.get_legend() is not None]
        boxes += [(f"caption {k}", ax.xaxis.label.get_window_extent(renderer)) for k, ax in enumerate(fig.axes)
                  if ax.get_xlabel()]
        for text in tokens.texts:  # a fate's figure inside its segment stays inside the bar
            inside = text.get_window_extent(renderer)
            assert tokens.get_window_extent(renderer).contains(inside.x1, inside.y1), text.get_text()
        for i, (name, box) in enumerate(boxes):
            assert fig.bbox.contains(box.x0, box.y0) and fig.bbox.contains(box.x1, box.y1), f"{name} is cut off"
            for other, second in boxes[i + 1:]:
                own = name.split()[1] == other.split()[1] and "axes" in name + other  # a legend inside its panel
                if not own and (name.startswith("legend") or other.startswith("legend") or "caption" in name + other):
                    assert not box.overlaps(second), f"{name} overlaps {other}"
    finally:
        plt.close(fig)


def record(step: int, wasted: int, step_s: float, kind: str = "short") -> dict:
    return {"step": step, "round": kind, "wasted_tokens": wasted, "generated_tokens": 1000 + wasted,
            "step_s": step_s, "rollout_s": step_s / 2, "bubble_ratio": 0.1}


def test_the_timeline_drawn_is_the_step_that_cut_most_tokens_not_the_last():
    """The default run ends on a long round with nothing aborted: drawn, it hides tail batching."""
    run = [record(0, 300, 10.0), record(1, 800, 9.0), record(2, 800, 8.0), record(3, 0, 30.0, "long")]
    step, why = step_to_draw(run)
    assert step == 1 and "cut the most tokens" in why and "800 of 1,800 wasted" in why
    sync = [record(0, 0, 10.0), record(1, 0, 12.0), record(2, 0, 11.0)]  # nothing cut: the slowest shows the tail
    assert step_to_draw(sync) == (1, "the slowest step (no step wasted any tokens)")


@given(st.lists(st.tuples(st.integers(0, 3), st.floats(0.1, 100.0)), min_size=1, max_size=30))
def test_a_new_step_moves_the_choice_to_itself_or_leaves_it(steps):
    """What lets a run draw each step as it ends and keep only the chosen one's picture."""
    run = [record(i, wasted * 100, step_s) for i, (wasted, step_s) in enumerate(steps)]
    for k in range(1, len(run)):
        assert step_to_draw(run[: k + 1])[0] in (step_to_draw(run[:k])[0], k)


@pytest.mark.timeout(120)
def test_a_run_directory_keeps_the_timeline_of_the_chosen_step(tmp_path):
    from rollpacker.driver.step_log import Interval
    from rollpacker.train.outputs import RunDir

    run = RunDir(tmp_path / "run")
    drawn = []
    for rec in [record(0, 300, 10.0), record(1, 800, 9.0), record(2, 0, 30.0, "long")]:
        run.log_step(rec)
        intervals = [Interval("r0", 0.0, 2.0, "kept", num_tokens=40), Interval("r1", 0.5, 3.0, "aborted", num_tokens=9)]
        if run.plot_timeline(intervals, rec, capacity=4) is not None:
            drawn.append(rec["step"])
    assert drawn == [0, 1] and (tmp_path / "run" / "timeline.png").is_file()
