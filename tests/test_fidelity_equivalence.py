"""The pre-registered equivalence test of the fidelity runs (benchmarks/fidelity_equivalence.py): TOST on
paired seed differences, its wording, and the section made from committed metrics."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from fidelity_equivalence import Tost, paired, primary, section_lines  # noqa: E402
from fidelity_report import Curve  # noqa: E402


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-0.4, 0.4), min_size=2, max_size=8).filter(lambda d: len(set(d)) > 1))
def test_equivalence_is_shown_exactly_when_the_interval_lies_inside_the_margin(differences):
    test = Tost(tuple(differences))
    low, high = test.interval()
    if min(abs(low + test.margin), abs(high - test.margin)) > 1e-9:  # not on the boundary
        assert test.equivalent == (-test.margin < low and high < test.margin)
    assert low <= test.mean <= high


def test_the_verdict_says_what_the_test_showed_and_no_more():
    small = Tost((0.02, -0.01, 0.03, 0.0))
    assert small.equivalent and small.verdict().startswith("equivalent within +-0.10 (mean paired difference +0.010 over 4")
    wide = Tost((0.2, -0.1, 0.15, 0.05))  # the mean is inside the margin, its interval is not
    assert abs(wide.mean) < 0.1 and not wide.equivalent
    assert wide.verdict().startswith("equivalence within +-0.10 not shown")
    assert not Tost((0.01,)).equivalent  # one pair tests nothing


def test_the_primary_metric_averages_the_sampled_evaluations_after_step_0():
    evals = [{"step": 0, "eval_sampled_reward": 0.9}, {"step": 4, "eval_sampled_reward": 0.2},
             {"step": 8, "eval_sampled_reward": 0.4}, {"step": 12, "eval_sampled_reward": 1.0}]
    assert primary(evals) == pytest.approx(0.5333, abs=1e-4) and primary(evals, upto=8) == pytest.approx(0.3)
    assert primary(evals[:1]) is None
    runs = {("sync", 0): 0.3, ("tail", 0): 0.35, ("sync", 1): 0.4, ("tail", 2): 0.1}
    assert paired(runs, "tail") == [(0, pytest.approx(0.05))]  # seed 2 has no sync run: no pair


def test_the_section_states_the_design_and_tests_complete_pairs_only(tmp_path):
    def curve(policy: str, seed: int, level: float, steps: int = 8) -> Curve:
        evals = [{"step": k, "eval_sampled_reward": level + 0.001 * k, "eval_set": "abc"} for k in range(0, steps + 1, 4)]
        return Curve(policy, seed, [{"step": i, "step_s": 1.0} for i in range(steps)], evals)

    curves = [curve("sync", 0, 0.30), curve("tail", 0, 0.32), curve("sync", 1, 0.40), curve("tail", 1, 0.39),
              curve("sync", 2, 0.35), curve("tail", 2, 0.20, steps=4)]
    setting = {"setting": "t", "flags": ["--eval-every", "4"], "seeds": [0, 1, 2], "control": [0, 1]}
    text = "\n".join(section_lines(curves, setting, 8, tmp_path / "eq.png"))
    assert text.startswith("Pre-registered design (written before the runs of setting `t`)")
    assert "**tail - sync**: " in text and "over 2 seed pair(s)" in text and "seed 0 +0.020, seed 1 -0.010" in text
    assert "Runs not complete (not in the test): tail seed 2 (4 of 8 steps)" in text
    assert "Control, sync seed 1 - sync seed 0: +0.100." in text
    assert (tmp_path / "eq.png").stat().st_size > 0
    curves[1].evals[1]["eval_set"] = "other"
    assert "**Warning**: the runs were scored on 2 different held-out sets" in "\n".join(
        section_lines(curves, setting, 8, tmp_path / "eq.png"))


def test_a_tost_setting_s_report_carries_the_design_and_its_plot(tmp_path):
    import json

    from fidelity import Run
    from fidelity_report import report

    metrics = tmp_path / "m"
    for policy, seed, level in (("sync", 0, 0.3), ("tail", 0, 0.31), ("sync", 1, 0.4), ("tail", 1, 0.38)):
        folder = metrics / policy / f"seed{seed}"
        folder.mkdir(parents=True)
        steps = [{"step": i, "step_s": 1.0, "mean_reward": level, "mean_kept_length": 9.0,
                  "mean_generated_length": 9.0} for i in range(8)]
        evals = [{"step": k, "eval_reward": level, "eval_length": 9.0, "eval_prompts": 8, "eval_samples": 2,
                  "eval_sampled_reward": level, "eval_set": "abc"} for k in (0, 4, 8)]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
        (folder / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    (metrics / "setting.json").write_text(json.dumps({"setting": "t", "flags": ["--eval-every", "4"], "design": "tost",
                                                      "seeds": [0, 1], "control": [0, 1]}))
    results = tmp_path / "R.md"
    results.write_text("# Benchmark results\n")
    runs = [Run(p, s) for s in (0, 1) for p in ("sync", "tail")]
    text = report(metrics, tmp_path / "f.png", results, runs, 8)["text"]
    assert "Pre-registered design (written before the runs of setting `t`)" in text
    assert "**tail - sync**: equivalence within +-0.10 not shown" in text or "**tail - sync**: equivalent" in text
    assert "seed 0 +0.010, seed 1 -0.020" in text and "Control, sync seed 1 - sync seed 0: +0.100." in text
    assert (tmp_path / "f-equivalence.png").stat().st_size > 0 and "f-equivalence.png" in results.read_text()


def test_fewer_pairs_than_pre_registered_is_an_interim_look_without_a_verdict():
    interim = Tost((0.01, -0.01), planned=4)
    assert interim.equivalent and interim.verdict().startswith("interim, 2 of 4 pre-registered pairs: no verdict")
    assert Tost((0.01, -0.01, 0.0, 0.02), planned=4).verdict().startswith("equivalent within +-0.10")
