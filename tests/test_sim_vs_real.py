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
import sim_vs_real_repeat  # noqa: E402
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
SGLANG_TAILFIT_ROUND_BOUND = {"sync": 0.16, "tail": 0.13, "sorted": 0.19}
"""The same engine and sizes measured again (5 seeds, 8 steps) with the live terms fitted on a tail run of the fit
workload (`--fit-policy tail`, whose rounds differ in their finished and launched requests), the answer's way back
(`return_s`) and a launched request's cost (`submit_s`) with them: rounds sync 7.4-14.8%, tail 2.7-11.7%,
SortedRL 6.1-18.3% (seed 1; the engine against itself on its rounds: 13.3%)."""
SGLANG_TAILFIT_RATIO_BOUND = {"tail": 0.06, "sorted": 0.09}
"""Met: tail +4.7%, SortedRL +8.3%.  Without a launched request's cost (`submit_s`: SortedRL launches 34 requests
a round, sync 16) +7.6% and +14.8%."""
SGLANG_TAILFIT_WASTED_BOUND = {"tail": 0.05, "sorted": 0.13}
"""|predicted / measured - 1| of a policy's wasted tokens over all its rounds: tail -2.9%, SortedRL -11.1%.  Without
the answer's way back (the requests decode on while it travels) tail -11.0% and SortedRL -17.9%: in 25 of 30 tail
rounds the measured longest request ran further than the simulated one."""

SGLANG_AGAIN = ROOT / "benchmarks" / "sim_vs_real" / "sglang-tiny-tailfit-2.json"
SGLANG_AGAIN_ROUND_BOUND = {"sync": 0.46, "tail": 0.30, "sorted": 0.31}
SGLANG_AGAIN_RATIO_BOUND = {"tail": 0.07, "sorted": 0.24}
"""The tail-fitted measurement's command run again on a fresh machine of the same kind (5 seeds; its grid's decode
step 2.9 ms against 10.7, its rounds 0.25-0.7 s): what it met, a regression bound, not the targets (rounds sync
11.2-44.4%, tail 3.9-28.5%, SortedRL 2.7-30.1%; ratios tail +6.4%, SortedRL +22.7%: missed)."""

SGLANG_SORTEDFIT = ROOT / "benchmarks" / "sim_vs_real" / "sglang-tiny-sortedfit.json"
SGLANG_SORTEDFIT_ROUND_BOUND = {"sync": 0.17, "tail": 0.09, "sorted": 0.18}
SGLANG_SORTEDFIT_RATIO_BOUND = {"tail": 0.09, "sorted": 0.18}
"""The same machine and command with the live terms fitted on a SortedRL run of the fit workload (`--fit-policy
sorted`: its refills make launches and finishes differ): what it met (rounds sync 9.7-16.9%, tail 3.1-8.9%,
SortedRL 3.7-17.9%; ratios tail +8.4%, SortedRL +17.4%, missed), a regression bound, not the targets."""

SGLANG_SORTEDFIT_2 = ROOT / "benchmarks" / "sim_vs_real" / "sglang-tiny-sortedfit-2.json"
SGLANG_SORTEDFIT_2_ROUND_BOUND = {"sync": 0.28, "tail": 0.20, "sorted": 0.26}
SGLANG_SORTEDFIT_2_RATIO_BOUND = {"tail": 0.11, "sorted": 0.22}
"""That command again on the next session's machine, after the trainer's optimizer step was timed warm: what it
met (rounds sync 12.4-26.7%, tail 6.2-18.9%, SortedRL 10.1-24.9%; ratios tail +10.3%, SortedRL +20.9%: both
missed), a regression bound, not the targets."""
SGLANG_SORTEDFIT_2_TRAINER_BOUND = 0.10
"""Median over its runs of |predicted / measured - 1| of the mean trainer stage a step: 8.8% (the sixth
measurement, whose calibration timed a cold optimizer step and ran slow: 94%)."""

SGLANG_MIXEDFIT = ROOT / "benchmarks" / "sim_vs_real" / "sglang-tiny-mixedfit.json"
SGLANG_MIXEDFIT_ROUND_BOUND = {"sync": 0.32, "tail": 0.26, "sorted": 0.29}
SGLANG_MIXEDFIT_RATIO_BOUND = {"tail": 0.05, "sorted": 0.02}
"""The same machine, the live terms fitted on a sync and a SortedRL run of the fit workload together (`--fit-policy
sync,sorted`): ratios met (tail +4.1%, SortedRL -0.3%), rounds missed (sync 15.3-31.4%, tail 13.1-25.1%, SortedRL
13.4-28.5%; every policy's mean rollout predicted 0-21% slow), with an answer's way back of 100 ms that predicts
tail's wasted tokens 31% high: a regression bound, not the targets."""

SGLANG_MIXEDFIT_2 = ROOT / "benchmarks" / "sim_vs_real" / "sglang-tiny-mixedfit-2.json"
SGLANG_MIXEDFIT_2_ROUND_BOUND = {"sync": 0.10, "tail": 0.15, "sorted": 0.12}
SGLANG_MIXEDFIT_2_RATIO_BOUND = {"tail": 0.07, "sorted": 0.08}
"""That joint-fit command again (3 seeds, the same machine, the runs keeping request_spans): what it met, every
target (rounds sync 7.5-8.6%, tail 7.0-13.4%, SortedRL 2.9-10.3%; ratios tail -6.6%, SortedRL +7.3%)."""


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
    finished and launched requests: `refit` fits them again from the rounds the result keeps (the benchmark's own
    path, `with_live_term`: a finished request's and a launched request's costs fitted there, a finished
    request's 0 on these rounds; the answer's way back from their generated tokens) and finds the committed
    figures."""
    result = json.loads(SGLANG_TAILFIT.read_text())
    assert sim_vs_real.fit_policy(argparse.Namespace(**result["args"])) == "tail"
    assert len({sim_vs_real.finished(r) for r in result["fit_rounds"][1:]}) > 1
    again = sim_vs_real.refit(result, tmp_path)["profile"]
    for term in ("launch_s", "return_s", "submit_s", "step_s", "event_s"):
        assert again[term] == pytest.approx(result["profile"][term], rel=1e-3, abs=1e-6), term
    assert again["submit_s"] > 0 and again["step_s"] > 0 and again["return_s"] > 0


def test_sglang_with_the_live_terms_fitted_on_tail_rounds_stays_within_its_bounds(tmp_path):
    result = sim_vs_real.repredict(json.loads(SGLANG_TAILFIT.read_text()), tmp_path)
    assert_within(result, SGLANG_TAILFIT_ROUND_BOUND, SGLANG_TAILFIT_RATIO_BOUND)
    for policy, bound in SGLANG_TAILFIT_WASTED_BOUND.items():
        rows = [row for p, _, run in result["runs"] if p == policy for row in run]
        measured, predicted = (sum(row["wasted"][i] for row in rows) for i in (0, 1))
        assert abs(error(measured, predicted)) <= bound, (policy, measured, predicted)


def measurement(rollouts: dict, **args) -> dict:
    """A result of (policy, seed) -> its rounds' (measured, predicted) rollout and step seconds."""
    base = {"engine": "sglang", "model": "tiny", "workload": "servegen-r1", "scale_from": 8192, "prompts": 4,
            "samples": 4, "max_tokens": 64, "capacity": 16, "device": "cpu", "dtype": "float32"}
    runs = [[p, s, [{"step": i + 1, "round": "normal", "sim_round": "normal", "rollout": pair, "step_s": pair}
                    for i, pair in enumerate(rows)]] for (p, s), rows in rollouts.items()]
    return {"args": {**base, **args}, "runs": runs, "date": "d", "machine": "m", "profile": {"engine": "sglang"}}


def test_the_engine_against_itself_compares_the_same_requests_measured_twice():
    a = measurement({("sync", 0): [(1.0, 1.1), (2.0, 2.0), (1.0, 1.0)], ("tail", 0): [(1.0, 1.0)] * 3})
    b = measurement({("sync", 0): [(1.2, 1.1), (1.9, 2.0), (1.0, 1.0), (5.0, 5.0)], ("tail", 0): [(0.8, 1.0)] * 3,
                     ("tail", 1): [(1.0, 1.0)] * 3})
    rep = sim_vs_real_repeat.repeatability(a, b)
    assert set(rep) == {("sync", 0), ("tail", 0)}, "the runs both measured"
    assert rep["sync", 0]["rounds"] == 3, "the steps both measured"
    assert rep["sync", 0]["engine"] == pytest.approx(0.05)  # |1.2-1|, |1.9/2-1|, 0: median 5%
    assert rep["sync", 0]["simulator"] == pytest.approx((0.0, 2.0 / 1.9 - 1))  # each its own prediction
    assert rep["tail", 0]["ratio"][1][0] == pytest.approx((1.2 + 1.9 + 1.0) / 3 / 0.8)


def test_two_measurements_of_other_sizes_are_refused_naming_the_field():
    a = measurement({("sync", 0): [(1.0, 1.0)]})
    with pytest.raises(ValueError, match="differ in max_tokens"):
        sim_vs_real_repeat.repeatability(a, measurement({("sync", 0): [(1.0, 1.0)]}, max_tokens=128))
    with pytest.raises(ValueError, match="share no"):
        sim_vs_real_repeat.repeatability(a, measurement({("tail", 0): [(1.0, 1.0)]}))


def test_real_sglang_against_itself_over_the_two_committed_measurements():
    """The two SGLang measurements ran the same requests for seeds 0-2 (steps 1-5): their rounds differ by a median
    of 5-22% a run, as much as the simulator's errors; their sync ratios by under 10% (RESULTS)."""
    rep = sim_vs_real_repeat.repeatability(*(json.loads(p.read_text()) for p in (SGLANG_MEASURED, SGLANG_TAILFIT)))
    assert len(rep) == 9 and {r["rounds"] for r in rep.values()} == {5}
    assert 0.05 < min(r["engine"] for r in rep.values()) and max(r["engine"] for r in rep.values()) < 0.25
    assert max(abs(error(r["ratio"][0][0], r["ratio"][1][0])) for (p, _), r in rep.items() if p != "sync") < 0.10


def test_sglang_measured_again_on_a_faster_machine_stays_within_what_it_met(tmp_path):
    result = sim_vs_real.repredict(json.loads(SGLANG_AGAIN.read_text()), tmp_path)
    assert_within(result, SGLANG_AGAIN_ROUND_BOUND, SGLANG_AGAIN_RATIO_BOUND)


def test_sglang_with_the_live_terms_fitted_on_a_sortedrl_run_stays_within_what_it_met(tmp_path):
    result = json.loads(SGLANG_SORTEDFIT.read_text())
    assert sim_vs_real.fit_policy(argparse.Namespace(**result["args"])) == "sorted"
    assert result["profile"]["submit_s"] > 0 and result["profile"]["event_s"] > 0, "both per-request costs told apart"
    assert_within(sim_vs_real.repredict(result, tmp_path), SGLANG_SORTEDFIT_ROUND_BOUND, SGLANG_SORTEDFIT_RATIO_BOUND)


def test_sglang_measured_with_a_warm_optimizer_step_predicts_the_trainer_stage_within_its_bound(tmp_path):
    result = sim_vs_real.repredict(json.loads(SGLANG_SORTEDFIT_2.read_text()), tmp_path)
    assert_within(result, SGLANG_SORTEDFIT_2_ROUND_BOUND, SGLANG_SORTEDFIT_2_RATIO_BOUND)
    summary = summarize({(p, int(s)): rows for p, s, rows in result["runs"]})
    assert statistics.median(abs(error(*s["train"])) for s in summary.values()) <= SGLANG_SORTEDFIT_2_TRAINER_BOUND


def test_the_abort_calibration_waits_a_quarter_of_its_quickest_request_at_most_0_2_s():
    """A fixed 0.2 s let a fast CPU finish the quick mode's 128-token requests before their abort: the wait
    follows the engine's own grid."""
    import sim_vs_real_calibrate

    from rollpacker.sim.engine_profile import Run

    def grid(step_s: float) -> list[Run]:  # an engine whose decode step costs step_s whatever its rows
        return [Run(b, p, n, 0.001 + (n + 1) * step_s + 1e-6 * b * n) for b in (1, 8) for p in (32, 256) for n in (16, 128)]

    fast = sim_vs_real_calibrate.abort_after(grid(0.002), 128)
    assert fast == pytest.approx((0.001 + 129 * 0.002 + 1e-6 * 128) / 4, rel=1e-3) and fast < 0.2
    assert sim_vs_real_calibrate.abort_after(grid(0.05), 128) == 0.2


@pytest.mark.timeout(300)
def test_a_real_runs_trainer_stage_is_compared_step_by_step_with_the_simulators(tmp_path):
    """Through the live path: two steps of the reference trainer replaying the check workload on the embedded
    engine, then the simulator's steps with the committed profile; each round's row pairs the run's trainer
    stage (micro-batches, optimizer step, weight sync) with the simulator's, and the report shows their means."""
    from sim_vs_real_report import report, round_rows

    result = json.loads(MEASURED.read_text())
    args = sim_vs_real.parse_args(["--engine", "embedded", "--model", "tiny", "--steps", "3", "--prompts", "2",
                                   "--samples", "2", "--max-tokens", "32", "--capacity", "4"])
    check = sim_vs_real.Workload(args.workload, args.scale_from)
    records, tokens = sim_vs_real.real_run(args, "tail", 0, check, 3, tmp_path / "run", None)
    (tmp_path / "p").mkdir()
    sim = sim_vs_real.predict(args, tmp_path / "p" / "profile.json", "tail", 0, check, 3, result["stages"], tokens, 1,
                              sim_vs_real.EngineProfile(**result["profile"]))
    rows = round_rows(records, sim)
    assert [r["step"] for r in rows] == [1, 2]
    kept = sim_vs_real.fit_round(records[1])
    assert kept["request_spans"] == records[1]["request_spans"] and len(kept["requests"]) == len(kept["request_spans"])
    assert kept["abort_calls"] == records[1]["abort_calls"]
    for row, record, predicted in zip(rows, records[1:], sim[1:]):
        assert row["train"][0] == record["train_s"] + record["sync_s"] > 0
        assert row["train"][1] == predicted["train_s"] + predicted["sync_s"] > 0
    measured = {**result, "args": vars(args), "runs": [["tail", 0, rows]]}
    line = next(x for x in report(measured).splitlines() if x.startswith("| tail | 0 |"))
    mean_measured = (rows[0]["train"][0] + rows[1]["train"][0]) / 2
    assert f"| {mean_measured:.2f} / " in line, line


def test_fit_policy_takes_several_policies_each_once_and_names_a_wrong_one(capsys):
    assert sim_vs_real.parse_args(["--fit-policy", "sync,sorted"]).fit_policy == "sync,sorted"
    for text, named in (("sync,fifo", "'fifo' is none of them"), ("sync,sync", "each once")):
        with pytest.raises(SystemExit):
            sim_vs_real.parse_args(["--fit-policy", text])
        err = capsys.readouterr().err
        assert "--fit-policy" in err and named in err, err


def test_several_fit_runs_are_fitted_together_each_predicted_under_its_own_policy(tmp_path):
    """The sixth measurement's SortedRL fit rounds and the fifth's tail fit rounds (the same machine) as the fit
    runs of one result: each run keeps its own warm-up out and is predicted under its own policy; the live terms
    fitted over both differ from those of either alone, and the fit runs' policies survive a save."""
    sorted_fit, tail_fit = (json.loads(p.read_text()) for p in (SGLANG_SORTEDFIT, SGLANG_AGAIN))
    rounds = [{**r, "policy": "tail"} for r in tail_fit["fit_rounds"]] + [{**r, "policy": "sorted"}
                                                                         for r in sorted_fit["fit_rounds"]]
    both = {**sorted_fit, "args": {**sorted_fit["args"], "fit_policy": "tail,sorted"},
            "fit_rounds": [sim_vs_real.fit_round(r) for r in rounds]}
    args = argparse.Namespace(**both["args"])
    runs = sim_vs_real.fit_runs(args, both["fit_rounds"])
    assert [(p, len(r)) for p, r in runs] == [("tail", 10), ("sorted", 10)]
    assert [r["rollout_s"] for r in sim_vs_real.after_warmup(runs)] == [r["rollout_s"] for r in rounds[1:10] + rounds[11:]]
    predicted = sim_vs_real.predict_fit_runs(args, runs, sim_vs_real.EngineProfile(**both["profile"]),
                                             tmp_path / "profile.json", both["stages"], both["micro_batch_tokens"])
    assert len(predicted) == 18 and {s["round"] for s in predicted[:9]} == {"short", "long"}
    assert {s["round"] for s in predicted[9:]} == {"normal"}, "each run under its own policy"
    assert sim_vs_real.fit_runs(argparse.Namespace(**sorted_fit["args"]), sorted_fit["fit_rounds"]) == \
        [("sorted", sorted_fit["fit_rounds"])], "a result of one fit run: its policy"
    terms = ("launch_s", "return_s", "submit_s", "step_s", "event_s")
    together = sim_vs_real.refit(both, tmp_path)["profile"]
    alone = sim_vs_real.refit(sorted_fit, tmp_path)["profile"]
    assert [together[t] for t in terms] != [alone[t] for t in terms]


def test_sglang_fitted_on_a_sync_and_a_sortedrl_run_refits_to_its_profile_and_stays_within_what_it_met(tmp_path):
    result = json.loads(SGLANG_MIXEDFIT.read_text())
    args = argparse.Namespace(**result["args"])
    assert [(p, len(r)) for p, r in sim_vs_real.fit_runs(args, result["fit_rounds"])] == [("sync", 10), ("sorted", 10)]
    again = sim_vs_real.refit(result, tmp_path)
    for term in ("launch_s", "return_s", "submit_s", "step_s", "event_s"):
        assert again["profile"][term] == pytest.approx(result["profile"][term], rel=0.01, abs=1e-5), term
    assert_within(sim_vs_real.repredict(again, tmp_path), SGLANG_MIXEDFIT_ROUND_BOUND, SGLANG_MIXEDFIT_RATIO_BOUND)


@pytest.mark.timeout(300)
def test_a_real_rounds_requests_are_listed_beside_the_simulators_by_prompt_and_k(tmp_path):
    """Through the live path: a SortedRL run of the reference trainer replaying the check workload on the embedded
    engine, then its rounds request by request beside the simulation of the same run: both sides name the same
    requests by (prompt, k), each with its launch and its answer."""
    import sim_vs_real_timeline

    committed = json.loads(MEASURED.read_text())
    args = sim_vs_real.parse_args(["--engine", "embedded", "--model", "tiny", "--steps", "3", "--prompts", "2",
                                   "--samples", "2", "--max-tokens", "32", "--capacity", "4", "--policies", "sorted"])
    records, tokens = sim_vs_real.real_run(args, "sorted", 0, sim_vs_real.Workload(args.workload, args.scale_from), 3,
                                           tmp_path / "sorted-0", None)
    result = {"args": vars(args), "profile": committed["profile"], "stages": committed["stages"],
              "micro_batch_tokens": tokens}
    real = sim_vs_real_timeline.measured_steps(records)
    sim = sim_vs_real_timeline.simulated_steps(sim_vs_real_timeline.simulated(result, "sorted", 0).spans, len(records))
    opening = args.capacity  # the round's opening launches (the refills after them follow finishing order)
    assert set(list(real[0])[:opening]) == set(list(sim[0])[:opening]), "step 0 opens with the same requests on both sides"
    for record in records[1:]:
        table = sim_vs_real_timeline.rows(real[record["step"]], sim[record["step"]])
        assert sorted(t[0] for t in table) == sorted(real[record["step"]])
        assert len({t[0] for t in table}) == len(record["requests"]), "(prompt, k) names one request"
        first = [t for t in table if t[2] == 0.0]  # launched at the round's start in the simulation
        assert first and all(t[1] < 0.1 and t[3] >= t[1] and t[4] > 0 for t in first), first
    text = sim_vs_real_timeline.report(result, tmp_path, "sorted", 0, [1])
    assert "step 1 (" in text and "step 2 (" not in text and "first  launch:" in text and "stop   answer:" in text


def test_sglang_fitted_on_a_sync_and_a_sortedrl_run_again_meets_every_target(tmp_path):
    result = sim_vs_real.repredict(json.loads(SGLANG_MIXEDFIT_2.read_text()), tmp_path)
    assert sim_vs_real.fit_policy(argparse.Namespace(**result["args"])) == "sync,sorted"
    assert_within(result, SGLANG_MIXEDFIT_2_ROUND_BOUND, SGLANG_MIXEDFIT_2_RATIO_BOUND)


DEFAULT_AGAIN = ROOT / "benchmarks" / "sim_vs_real" / "embedded-default-2.json"
DEFAULT_AGAIN_ROUND_BOUND = {"sync": 0.10, "tail": 0.14, "sorted": 0.36}
DEFAULT_AGAIN_RATIO_BOUND = {"tail": 0.06, "sorted": 0.20}
"""The default model measured again with the padded attention term (`attention_columns` 16) and its fit rounds
kept: sync/tail -5.4% and rounds sync 6.7-9.0%, tail 4.5-13.5% met; SortedRL's rounds 23.8-35.3% and sync/SortedRL
-19.2% missed (its refills answered in 0.49-0.63 s on the engine, 0.93-1.05 s simulated): a regression bound."""


def test_the_default_model_measured_again_stays_within_what_it_met(tmp_path):
    result = sim_vs_real.repredict(json.loads(DEFAULT_AGAIN.read_text()), tmp_path)
    assert result["profile"]["attention_columns"] == 16 and len(result["fit_rounds"]) == 3
    assert_within(result, DEFAULT_AGAIN_ROUND_BOUND, DEFAULT_AGAIN_RATIO_BOUND)
