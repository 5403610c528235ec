"""The abort latency measured on live rounds: a fit run's rounds record when the driver sent each abort
(`abort_calls`) and when each aborted answer came back (`request_spans`); where they do, the profile's abort
terms are fitted on them instead of on the calibration's idle aborts (one instance working, any other idle)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import attrs
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import sim_vs_real  # noqa: E402
from sim_vs_real_fit import live_aborts, with_live_aborts  # noqa: E402
from test_sim_vs_real import assert_within  # noqa: E402

SGLANG_MIXEDFIT_3 = ROOT / "benchmarks" / "sim_vs_real" / "sglang-tiny-mixedfit-3.json"
AS_MEASURED_ROUND_BOUND = {"sync": 0.30, "tail": 0.32, "sorted": 0.30}
AS_MEASURED_RATIO_BOUND = {"tail": 0.06, "sorted": 0.06}
"""The joint-fit command a third time (5 seeds, this machine, the runs keeping their abort calls), predicted with
the profile it was measured with (abort latency from the calibration's idle aborts): ratios met (tail -5.8%,
SortedRL -5.2%), rounds missed (sync 3.6-29.5%, tail 14.5-31.6%, SortedRL 7.8-29.3%)."""
REFIT_ROUND_BOUND = {"sync": 0.151, "tail": 0.17, "sorted": 0.13}
REFIT_RATIO_BOUND = {"tail": 0.07, "sorted": 0.08}
"""The same measurement refitted with the abort latency of its fit runs' live SortedRL rounds (14.5 ms + 3.8 ms
a request caught, against 5.4 ms + 2.2 ms idle): rounds sync 8.9-15.0%, tail 10.6-16.8%, SortedRL 1.7-12.4%;
ratios tail -6.7%, SortedRL -7.5%."""


def spans_round(calls: list, ends: dict) -> dict:
    """A fit round of aborted ("abort": answer times) and finished ("stop") requests, with its abort calls."""
    requests = [[0, 5, reason] for reason, times in ends.items() for _ in times]
    return {"rollout_s": 1.0, "requests": requests, "abort_calls": calls,
            "request_spans": [[0.0, t] for times in ends.values() for t in times]}


def test_a_live_abort_is_timed_from_its_call_to_its_last_aborted_answer_shared_over_the_instances():
    rounds = [spans_round([[0.5, 5]], {"stop": [0.45], "abort": [0.52, 0.56, 0.54]}),
              spans_round([[0.2, 1], [0.3, 2]], {"abort": [0.25, 0.35]}),  # several calls: left out
              spans_round([], {"stop": [0.4]}),  # nothing aborted
              spans_round([[0.7, 2]], {"stop": [0.71, 0.72]})]  # both finished before the abort landed
    assert live_aborts(rounds, instances=2) == [(2, pytest.approx(0.06))]
    assert live_aborts(rounds, instances=1) == [(3, pytest.approx(0.06))]
    assert live_aborts([{"rollout_s": 1.0, "requests": [[0, 5, "abort"]]}], 1) == [], "a round without spans"


def test_the_abort_terms_are_fitted_on_live_rounds_only_at_two_counts_or_more():
    profile = sim_vs_real.EngineProfile(**json.loads(SGLANG_MIXEDFIT_3.read_text())["profile"])
    assert with_live_aborts(profile, [(4, 0.03), (4, 0.031), (4, 0.029)]) is profile
    assert with_live_aborts(profile, [(2, 0.02), (4, 0.03)]) is profile
    fitted = with_live_aborts(profile, [(2, 0.02), (4, 0.03), (6, 0.04)])
    assert fitted.abort_s == pytest.approx(0.01) and fitted.abort_request_s == pytest.approx(0.005)
    assert fitted.fit["live_aborts"] == [[2, 0.02], [4, 0.03], [6, 0.04]] and fitted.fit["aborts"] == profile.fit["aborts"]
    assert attrs.evolve(fitted, abort_s=profile.abort_s, abort_request_s=profile.abort_request_s,
                        fit=profile.fit) == profile, "nothing else changes"


def test_sglang_refitted_with_its_live_abort_latency_predicts_its_rounds_closer(tmp_path):
    """The third joint-fit measurement's fit rounds recorded their aborts: refitted, its abort terms come from the
    SortedRL fit run's rounds, and its rounds are predicted within the bounds below (a profile that kept the idle
    calibration's abort latency misses sync's, tail's and SortedRL's)."""
    result = json.loads(SGLANG_MIXEDFIT_3.read_text())
    assert sim_vs_real.fit_policy(argparse.Namespace(**result["args"])) == "sync,sorted"
    assert_within(sim_vs_real.repredict(result, tmp_path), AS_MEASURED_ROUND_BOUND, AS_MEASURED_RATIO_BOUND)
    again = sim_vs_real.refit(result, tmp_path)
    assert_within(sim_vs_real.repredict(again, tmp_path), REFIT_ROUND_BOUND, REFIT_RATIO_BOUND)
    profile = again["profile"]
    assert len(profile["fit"]["live_aborts"]) == 9 and profile["fit"]["aborts"] == result["profile"]["fit"]["aborts"]
    caught = 7
    live, idle = (p["abort_s"] + p["abort_request_s"] * caught for p in (profile, result["profile"]))
    assert live > 1.5 * idle, (live, idle)


@pytest.mark.timeout(300)
def test_a_real_sortedrl_runs_kept_rounds_give_its_live_abort_points(tmp_path):
    """Through the live path: a SortedRL run of the reference trainer on the embedded engine aborts the rest of each
    round in one call; its rounds, as a fit run keeps them, give one point per aborted round, from the call to the
    last aborted answer, and the call is the record's own."""
    args = sim_vs_real.parse_args(["--engine", "embedded", "--model", "tiny", "--steps", "4", "--prompts", "2",
                                   "--samples", "2", "--max-tokens", "32", "--capacity", "4", "--policies", "sorted"])
    records, _ = sim_vs_real.real_run(args, "sorted", 0, sim_vs_real.Workload(args.workload, args.scale_from), 4,
                                      tmp_path / "sorted-0", None)
    kept = [sim_vs_real.fit_round(r) for r in records]
    points = live_aborts(kept, instances=1)
    aborted = [r for r in records if len(r["abort_calls"]) == 1 and any(q[2] == "abort" for q in r["requests"])]
    assert aborted and len(points) == len(aborted)
    for (caught, seconds), record in zip(points, aborted):
        ends = [s[1] for q, s in zip(record["requests"], record["request_spans"]) if q[2] == "abort"]
        assert caught == len(ends) <= record["abort_calls"][0][1]
        assert 0 <= seconds == pytest.approx(max(ends) - record["abort_calls"][0][0])


SGLANG_MIXEDFIT_4 = ROOT / "benchmarks" / "sim_vs_real" / "sglang-tiny-mixedfit-4.json"
FOURTH_ROUND_BOUND = {"sync": 0.38, "tail": 0.22, "sorted": 0.37}
FOURTH_RATIO_BOUND = {"tail": 0.03, "sorted": 0.11}
"""The joint fit a fourth time, measured with this tree's fit (abort latency from its live SortedRL rounds, 9.4 ms +
4.5 ms a request caught): sync/tail met (+1.8%), sync/SortedRL missed (+10.6%), rounds missed (sync 24.7-37.4%,
tail 9.0-21.5%, SortedRL 13.9-36.3%), with 80 ms fitted as an answer's way back: a regression bound."""


def test_sglang_fitted_together_a_fourth_time_stays_within_what_it_met(tmp_path):
    result = json.loads(SGLANG_MIXEDFIT_4.read_text())
    assert len(result["profile"]["fit"]["live_aborts"]) == 9
    assert_within(sim_vs_real.repredict(result, tmp_path), FOURTH_ROUND_BOUND, FOURTH_RATIO_BOUND)


@pytest.mark.parametrize("way_back", [0.0, 0.02, 0.04, 0.08])
def test_the_sync_ratios_hold_whatever_way_back_the_fit_takes_while_the_rounds_do_not(tmp_path, monkeypatch, way_back):
    """The fit rounds do not tell an answer's way back (0-80 ms fit them alike, rms 16-20%): refitted with each,
    the third and fourth joint fits predict both sync ratios within 10% while their rounds move by 4-37%."""
    import sim_vs_real_fit

    monkeypatch.setattr(sim_vs_real_fit, "RETURNS", (way_back,))
    for path in (SGLANG_MIXEDFIT_3, SGLANG_MIXEDFIT_4):
        result = sim_vs_real.repredict(sim_vs_real.refit(json.loads(path.read_text()), tmp_path), tmp_path)
        assert result["profile"]["return_s"] == way_back
        assert_within(result, {"sync": 1.0, "tail": 1.0, "sorted": 1.0}, {"tail": 0.10, "sorted": 0.10})

