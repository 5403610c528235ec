"""The simulator against a real engine, as a regression test: the committed measurement of
benchmarks/sim_vs_real.py (the tiny model on the embedded engine, this machine kind: sync, tail and SortedRL
on servegen-r1 replayed through the real rollout path) is predicted again by this tree's simulator from the
engine profile and stages it was measured with, and must stay within the bounds it met: a latency-model term
broken by hand (a decode step that ignores its batch, a prefill that costs nothing, the live path's step_s
or launch_s dropped, an abort latency blind to the requests it catches) fails it."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import sim_vs_real  # noqa: E402
from sim_vs_real_report import error, summarize  # noqa: E402

MEASURED = ROOT / "benchmarks" / "sim_vs_real" / "embedded-tiny.json"
ROUND_BOUND = {"sync": 0.10, "tail": 0.15, "sorted": 0.20}
"""Median over a run's rounds of |predicted / measured - 1| of the rollout, for every seed: what the committed
measurement met (sync 2.3-4.2%, tail 5.0-9.9%, SortedRL 1.7-13.9%), with a little room.  Without the live
path's cost per decode step (`EngineProfile.step_s`), or with it charged per finished request instead, tail and
SortedRL's rounds miss it (their many finished and admitted requests over few decode steps)."""
RATIO_BOUND = {"tail": 0.05, "sorted": 0.06}
"""|predicted / measured - 1| of the median over seeds of the sync/policy step-time ratio."""
DEFAULT_MEASURED = ROOT / "benchmarks" / "sim_vs_real" / "embedded-default.json"
DEFAULT_ROUND_BOUND = {"sync": 0.15, "tail": 0.15, "sorted": 0.20}
"""The default model (SmolLM2-135M, 64 tokens): rounds of 6-30 tokens a response, whose prefill is a large
share; the committed measurement met sync 3.2-13.9%, tail 6.5-9.5%, SortedRL 4.8-15.8% (its seed 1 ran other
requests in two rounds than the engine did).  With each sample prefilling its own prompt (the engine shares
a group's: `EngineProfile.shared_prefill`), tail's short rounds miss it (20-31%)."""
DEFAULT_RATIO_BOUND = {"tail": 0.05, "sorted": 0.10}
SGLANG_MEASURED = ROOT / "benchmarks" / "sim_vs_real" / "sglang-tiny.json"
SGLANG_ROUND_BOUND = {"sync": 0.13, "tail": 0.25, "sorted": 0.23}
"""Real SGLang 0.5.23, two servers, the tiny model, training after the round: the committed measurement met
sync 7.6-11.5%, tail 12.2-23.0%, SortedRL 14.3-20.8% (tail's seed 1 and SortedRL miss the 15% target; tail's
seed 1 is one round that waited on the slower of the two servers, which share 2 cores with their front ends and
the driver).  Without the launch
latency (`EngineProfile.launch_s`: a submission's way in and the last answer's way back) sync's rounds miss
it (16.6%)."""
SGLANG_RATIO_BOUND = {"tail": 0.05, "sorted": 0.10}
"""Met: tail -0.4%, SortedRL +7.0%.  Without the abort latency's growth with the requests caught
(`abort_request_s`), SortedRL's ratio misses it (+11.8%)."""

SGLANG_TAILFIT = ROOT / "benchmarks" / "sim_vs_real" / "sglang-tiny-tailfit.json"
SGLANG_TAILFIT_ROUND_BOUND = {"sync": 0.15, "tail": 0.13, "sorted": 0.17}
"""The same engine and sizes measured again (5 seeds, 8 steps) with the live terms fitted on a tail run of the fit
workload (`--fit-policy tail`): rounds sync 3.4-13.4%, tail 5.9-11.5%, SortedRL 4.5-16.1%."""
SGLANG_TAILFIT_RATIO_BOUND = {"tail": 0.09, "sorted": 0.17}
"""Met: tail +7.5%, SortedRL +15.6% (missed: the 10% target)."""

@pytest.fixture(scope="module")
def repredicted(tmp_path_factory):
    return sim_vs_real.repredict(json.loads(MEASURED.read_text()), tmp_path_factory.mktemp("repredict"))


@pytest.fixture(scope="module")
def sglang_repredicted(tmp_path_factory):
    return sim_vs_real.repredict(json.loads(SGLANG_MEASURED.read_text()), tmp_path_factory.mktemp("sglang"))


@pytest.fixture(scope="module")
def default_repredicted(tmp_path_factory):
    return sim_vs_real.repredict(json.loads(DEFAULT_MEASURED.read_text()), tmp_path_factory.mktemp("default"))


def test_the_replay_is_the_same_workload_on_both_sides(repredicted):
    """The simulator launches the very lengths the engine replayed: a sync round (nothing aborted) has the same
    longest request on both sides; a round that aborts its tail cuts its longest one a few tokens apart (the
    abort lands mid-step on one side, between segments on the other)."""
    for policy, _, rows in repredicted["runs"]:
        for row in rows:
            measured, predicted = row["longest"]
            if policy == "sync":
                assert measured == predicted
            assert abs(measured - predicted) <= max(2, 0.1 * measured), (policy, row)


def assert_within(result: dict, round_bound: dict, ratio_bound: dict) -> None:
    runs = {(policy, int(seed)): rows for policy, seed, rows in result["runs"]}
    summary = summarize(runs)
    for key, s in summary.items():
        assert s["round_error"] <= round_bound[key[0]], (key, s["round_error"])
    for policy in {p for p, _ in summary if p != "sync"}:
        ratios = [s["ratio"] for (p, _), s in summary.items() if p == policy]
        measured, predicted = (statistics.median(r[i] for r in ratios) for i in (0, 1))
        assert abs(error(measured, predicted)) <= ratio_bound[policy], (policy, measured, predicted)


def test_each_round_and_the_sync_ratio_are_predicted_within_their_bounds(repredicted):
    assert_within(repredicted, ROUND_BOUND, RATIO_BOUND)


def test_the_default_models_rounds_and_ratios_are_predicted_within_their_bounds(default_repredicted):
    """The same on the default model, where a round's prefill counts: the profile says the engine prefills a
    group's prompt once an admission, and the simulator charges it so."""
    assert default_repredicted["profile"]["shared_prefill"] is True
    assert_within(default_repredicted, DEFAULT_ROUND_BOUND, DEFAULT_RATIO_BOUND)


def test_the_measurement_says_what_it_ran():
    result = json.loads(MEASURED.read_text())
    args = argparse.Namespace(**result["args"])
    assert args.engine == "embedded" and args.model == "tiny" and {"sync", "tail"} <= set(args.policies.split(","))
    assert result["profile"]["machine"] and result["profile"]["fit"]["runs"]


def test_sglangs_rounds_and_ratios_are_predicted_within_their_bounds(sglang_repredicted):
    """Real SGLang: each server takes its share of the cores, training waits for the round, a launch reaches its
    server the profile's launch latency after it, and its abort latency holds back the end of a round that aborts."""
    profile = sglang_repredicted["profile"]
    assert sglang_repredicted["args"]["engine"] == "sglang" and profile["launch_s"] > 0
    assert profile["abort_s"] > 0 and profile["abort_request_s"] > 0 and len(profile["fit"]["aborts"]) == 4
    assert_within(sglang_repredicted, SGLANG_ROUND_BOUND, SGLANG_RATIO_BOUND)


def test_sglangs_live_terms_are_fitted_again_from_the_fit_rounds_it_kept(tmp_path):
    """The profile's live terms come from its fit run, a tail run of the fit workload whose rounds differ in their
    finished requests: `refit` fits them again from the rounds the result keeps (the benchmark's own path,
    `with_live_term`, a finished request's cost a fitted term there: on these rounds 0) and finds the committed
    figures."""
    result = json.loads(SGLANG_TAILFIT.read_text())
    assert sim_vs_real.fit_policy(argparse.Namespace(**result["args"])) == "tail"
    assert len({sim_vs_real.finished(r) for r in result["fit_rounds"][1:]}) > 1
    again = sim_vs_real.refit(result, tmp_path)["profile"]
    for term in ("launch_s", "step_s", "event_s"):
        assert again[term] == pytest.approx(result["profile"][term], rel=1e-3, abs=1e-6), term
    assert again["launch_s"] > 0 and again["step_s"] > 0


def test_sglang_with_the_live_terms_fitted_on_tail_rounds_stays_within_its_bounds(tmp_path):
    result = sim_vs_real.repredict(json.loads(SGLANG_TAILFIT.read_text()), tmp_path)
    assert_within(result, SGLANG_TAILFIT_ROUND_BOUND, SGLANG_TAILFIT_RATIO_BOUND)
