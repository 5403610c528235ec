"""Engine profiles: a fit recovers the constants that made the timings, a profile round-trips through its
file, a bad file is one error naming the file and the field, and the simulator's instances run on it."""

from __future__ import annotations

import json

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollpacker.sim.cli import main as simulate
from rollpacker.sim.config import SimConfig
from rollpacker.sim.engine import Instance, SimRequest
from rollpacker.sim.engine_profile import (TERMS, ProfileError, Run, fit_abort, fit_live_terms, fit_profile, fit_return_s,
                                          load_profile)
from rollpacker.sim.simulation import Simulation

TRUE = {"run_overhead_s": 0.012, "prefill_t1": 9e-6, "t0": 0.0035, "t1": 0.0005, "t2": 2e-7}
GRID = [(b, p, n) for b in (1, 4, 16, 64) for p in (32, 256) for n in (16, 128)]


def timed(constants: dict) -> list[Run]:
    runs = [Run(b, p, n, 1.0) for b, p, n in GRID]
    return [attrs.evolve(r, seconds=sum(constants[t] * f for t, f in zip(TERMS, r.features()))) for r in runs]


def profile(**constants):
    return fit_profile(timed(constants or TRUE), engine="embedded", model="tiny", machine="test", date="2026-11-27",
                       max_running=64, kv_capacity=10**6, abort_s=0.002)


def test_a_fit_recovers_the_constants_and_round_trips_through_its_file(tmp_path):
    fitted = profile()
    for term, value in TRUE.items():
        assert getattr(fitted, term) == pytest.approx(value, rel=1e-6)
    assert fitted.fit["max_abs_error"] < 1e-9 and len(fitted.fit["runs"]) == len(GRID)
    fitted.save(tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json") == fitted
    attrs.evolve(fitted, shared_prefill=True).save(tmp_path / "shared.json")
    assert load_profile(tmp_path / "shared.json").shared_prefill is True


def test_a_constant_the_timings_do_not_need_is_held_at_zero_not_negative():
    fitted = profile(**{**TRUE, "t2": 0.0, "run_overhead_s": 0.0})
    assert fitted.t2 >= 0 and fitted.run_overhead_s >= 0
    assert fitted.t0 == pytest.approx(TRUE["t0"], rel=1e-3) and fitted.t1 == pytest.approx(TRUE["t1"], rel=1e-3)


@pytest.mark.parametrize("change,message", [
    (lambda d: d.pop("t1"), "missing t1"),
    (lambda d: d.update(t3=1.0), "unknown field 't3'"),
    (lambda d: d.update(t0=-1.0), "t0 must be a finite number >= 0"),
    (lambda d: d.update(max_running="64"), "max_running must be a finite number"),
    (lambda d: d.update(max_running=0), "max_running"),
    (lambda d: d.update(shared_prefill="yes"), "shared_prefill must be true or false"),
    (lambda d: d.update(abort_request_s=-0.01), "abort_request_s must be a finite number >= 0"),
    (lambda d: d.update(launch_s=float("nan")), "launch_s must be a finite number >= 0"),
    (lambda d: d.update(return_s=-0.04), "return_s must be a finite number >= 0"),
    (lambda d: d.update(submit_s="7 ms"), "submit_s must be a finite number >= 0"),
    (lambda d: d.update(attention_columns=16.5), "attention_columns must be a whole number"),
    (lambda d: d.update(attention_columns=-16), "attention_columns must be a finite number >= 0"),
    (lambda d: d.update(decode_rows=[[0, 0.01]]), "decode_rows must be a list of \\[rows >= 1"),
    (lambda d: d.update(decode_rows=[[4, 0.01], [4, 0.02]]), "each rows count once"),
    (lambda d: d.update(decode_rows=[[4, "10 ms"]]), "decode_rows must be"),
    (lambda d: d.update(loop_s=-0.001), "loop_s must be a finite number >= 0"),
])
def test_a_bad_profile_is_one_error_naming_the_file_and_the_field(tmp_path, change, message):
    data = profile().to_dict()
    change(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=message) as info:
        load_profile(path)
    assert str(path) in str(info.value)


def test_a_file_that_is_not_a_profile_is_one_line_from_simulate(tmp_path, capsys):
    path = tmp_path / "p.json"
    path.write_text("{not json")
    assert simulate(["--engine-profile", str(path), "--no-progress"]) == 2
    assert f"--engine-profile {path}: not a JSON file" in capsys.readouterr().err
    profile().save(path)
    assert simulate(["--engine-profile", str(path), "--tp", "2", "--no-progress"]) == 2
    assert "--tp 1 --tp-mode fixed" in capsys.readouterr().err


def test_a_lone_request_on_a_profile_takes_the_profiles_time(tmp_path):
    """One prompt, one sample of n tokens after p prompt tokens, one instance: prefill (a forward: t0, and
    its tokens), then n decode steps of one row whose context grows by one a step (the fluid sum of the
    segment arithmetic); the calibration's run overhead is not simulated."""
    fitted = profile()
    fitted.save(tmp_path / "p.json")
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"prompt": "a", "lengths": [100]}) + "\n")
    config = SimConfig(workload=str(workload), policy="sync", prompts=1, samples=1, max_tokens=512, steps=1,
                       instances=1, engine_profile=str(tmp_path / "p.json"), dataset_prompts=1)
    [step] = Simulation(config).run()["steps"]
    p, n = 256, 100  # (a JSONL workload's prompts are 256 tokens)
    decode = n * (fitted.t0 + fitted.t1 + fitted.t2 * p) + fitted.t2 * n * n / 2
    assert step["rollout_s"] == pytest.approx(fitted.t0 + fitted.prefill_t1 * p + decode, rel=1e-6)


def test_the_live_paths_step_s_is_paid_by_each_decode_step_and_not_by_the_prefill(tmp_path):
    """step_s (the live path's share of each engine step) adds to every decode step's fixed cost; the
    admission's prefill, part of the same engine step, pays t0 only; a finished request costs nothing more."""
    plain, _ = run_sync(tmp_path, profile(), [40, 80, 120], 3)
    charged, intervals = run_sync(tmp_path, attrs.evolve(profile(), step_s=0.002), [40, 80, 120], 3)
    assert charged["rollout_s"] == pytest.approx(plain["rollout_s"] + 120 * 0.002, rel=1e-9)
    [prefill] = [b - a for a, b, _, kind in intervals if kind == "prefill"]
    assert prefill == pytest.approx(profile().t0 + profile().prefill_t1 * 3 * 256, rel=1e-9)
    assert not any(kind == "event" for *_, kind in intervals)


def test_the_live_terms_are_fitted_per_launch_and_per_decode_step_of_the_live_rounds():
    """Rounds of 50 and 100 decode steps, each 0.1 s (a launch) + 3 ms a step slower than predicted without
    them: both found; a round the model already over-predicts does not make either negative."""
    fitted = fit_live_terms([1.25, 2.4, 0.95], [1.0, 2.0, 0.7], [1, 1, 1], [50, 100, 50])
    assert fitted == pytest.approx({"launch_s": 0.1, "step_s": 0.003})
    assert fit_live_terms([1.0, 2.0], [1.2, 2.3], [1, 1], [50, 90]) == {"launch_s": 0.0, "step_s": 0.0}
    assert fit_live_terms([1.15, 2.3], [1.0, 2.0], [0, 0], [50, 100]) == pytest.approx({"launch_s": 0, "step_s": 0.003})



def test_a_finished_requests_live_cost_is_fitted_where_the_rounds_differ_in_finished_requests():
    """Rounds with 25, 12, 16 and 20 finished requests on their path, each 0.05 s (a launch) + 2 ms a step +
    20 ms a finished request slower than predicted without them: all three found; without the events column
    the same rounds give only the other two."""
    launches, steps, events = [1, 1, 1, 1], [20, 60, 64, 30], [25, 12, 16, 20]
    without = [0.5, 1.5, 1.6, 0.8]
    measured = [w + 0.05 + 0.002 * n + 0.02 * e for w, n, e in zip(without, steps, events)]
    fitted = fit_live_terms(measured, without, launches, steps, events)
    assert fitted == pytest.approx({"launch_s": 0.05, "step_s": 0.002, "event_s": 0.02})
    assert set(fit_live_terms(measured, without, launches, steps)) == {"launch_s", "step_s"}

def run_sync(tmp_path, fitted, lengths, samples) -> tuple[dict, list]:
    """One sync step of one prompt with `samples` samples of `lengths` on one instance of `fitted`: its
    record and the instance's intervals (start, end, running, kind)."""
    fitted.save(tmp_path / "p.json")
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"prompt": "a", "lengths": lengths}) + "\n")
    config = SimConfig(workload=str(workload), policy="sync", prompts=1, samples=samples, max_tokens=512, steps=1,
                       instances=1, engine_profile=str(tmp_path / "p.json"), dataset_prompts=1)
    sim = Simulation(config, record_timeline=True)
    return sim.run()["steps"][0], sim.timelines[0]["intervals"][0]


def test_each_finished_request_costs_the_engine_event_s(tmp_path):
    plain, _ = run_sync(tmp_path, profile(), [40, 80, 120], 3)
    charged, intervals = run_sync(tmp_path, attrs.evolve(profile(), event_s=0.01), [40, 80, 120], 3)
    assert charged["rollout_s"] == pytest.approx(plain["rollout_s"] + 3 * 0.01, rel=1e-9)
    assert sum(b - a for a, b, _, kind in intervals if kind == "event") == pytest.approx(0.03)


def test_waiting_requests_start_in_batches_under_admit_fraction(tmp_path):
    """Four slots, eight samples: each freed slot starts a request at once (admit_fraction 0: five prefills),
    or, with admit_fraction 1.0, only once as many can start as run, or every waiting one (fewer prefills,
    of more requests each)."""
    lengths = [10, 30, 50, 70, 90, 110, 130, 150]
    at_once = attrs.evolve(profile(), max_running=4)
    _, eager = run_sync(tmp_path, at_once, lengths, 8)
    _, batched = run_sync(tmp_path, attrs.evolve(at_once, admit_fraction=1.0), lengths, 8)
    prefills = lambda intervals: sum(kind == "prefill" for *_, kind in intervals)  # noqa: E731
    assert prefills(eager) == 5 and prefills(batched) < prefills(eager)


def test_an_engine_that_shares_a_prompts_prefill_computes_it_once_an_admission(tmp_path):
    """shared_prefill (the embedded engine's Runner.prefill): three samples of one prompt admitted together
    prefill its 256 tokens once; with four slots and eight samples, each later admission computes the prompt
    again (nothing is cached across prefills): five prefills of one prompt each."""
    p, t0, per_token = 256, profile().t0, profile().prefill_t1
    plain, _ = run_sync(tmp_path, profile(), [40, 80, 120], 3)
    shared, intervals = run_sync(tmp_path, attrs.evolve(profile(), shared_prefill=True), [40, 80, 120], 3)
    [prefill] = [b - a for a, b, _, kind in intervals if kind == "prefill"]
    assert prefill == pytest.approx(t0 + per_token * p, rel=1e-9)
    assert shared["rollout_s"] == pytest.approx(plain["rollout_s"] - 2 * per_token * p, rel=1e-9)
    _, eager = run_sync(tmp_path, attrs.evolve(profile(), shared_prefill=True, max_running=4),
                        [10, 30, 50, 70, 90, 110, 130, 150], 8)
    prefills = [b - a for a, b, _, kind in eager if kind == "prefill"]
    assert prefills == pytest.approx([t0 + per_token * p] * 5, rel=1e-9)


def test_a_shared_prefill_still_charges_a_preempted_request_and_one_without_a_group():
    """A request coming back with generated tokens (a preemption's recompute), or with no group (a resumed
    prefix), prefills its own context even beside a sibling."""
    cost = attrs.evolve(profile(), shared_prefill=True).cost()
    inst = Instance(index=0, cost=cost, max_running=8, watermark=0.0)
    for req in (SimRequest("a", 100, 10, "stop", group="g"), SimRequest("b", 100, 10, "stop", group="g"),
                SimRequest("c", 100, 10, "stop", generated=20, group="g"), SimRequest("d", 100, 10, "stop")):
        inst.submit(req, 0.0)
    inst.admit()
    assert inst.time == pytest.approx(cost.prefill_batch_s + cost.prefill_t1 * (100 + 120 + 100), rel=1e-9)


def test_a_round_that_aborts_its_tail_ends_the_profiles_abort_latency_later(tmp_path):
    """abort_s (the engine's measured time from an abort to its result): a tail round's aborts are answered
    that long after they are sent, so the round ends exactly abort_s later (one abort call for the tail); the
    same tokens are kept and wasted."""
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps({"prompt": f"p{i}", "lengths": [20, 30, 40, 400]}) + "\n" for i in range(8)))
    steps = []
    for abort_s in (0.0, 0.5):
        attrs.evolve(profile(), abort_s=abort_s).save(tmp_path / "p.json")
        config = SimConfig(workload=str(workload), policy="tail", prompts=2, samples=4, max_tokens=512, steps=1,
                           instances=1, engine_profile=str(tmp_path / "p.json"), dataset_prompts=8)
        steps += Simulation(config).run()["steps"]
    assert steps[0]["round"] == "short" and steps[0]["wasted_tokens"] > 0, "the case under test: a tail was aborted"
    assert steps[1]["rollout_s"] == pytest.approx(steps[0]["rollout_s"] + 0.5, rel=1e-9)
    assert (steps[1]["kept_tokens"], steps[1]["wasted_tokens"]) == (steps[0]["kept_tokens"], steps[0]["wasted_tokens"])


def test_a_launch_reaches_the_engine_the_profiles_launch_latency_later(tmp_path):
    """launch_s (the live path's way in, fitted on a live run): a sync round, all launched at its start, ends
    exactly launch_s later, its prefill and decoding unchanged, shifted."""
    plain, before = run_sync(tmp_path, profile(), [40, 80, 120], 3)
    late, after = run_sync(tmp_path, attrs.evolve(profile(), launch_s=0.25), [40, 80, 120], 3)
    assert late["rollout_s"] == pytest.approx(plain["rollout_s"] + 0.25, rel=1e-9)
    assert [(n, kind) for _, _, n, kind in before] == [(n, kind) for _, _, n, kind in after]
    assert [t + 0.25 for a, b, *_ in before for t in (a, b)] == pytest.approx([t for a, b, *_ in after for t in (a, b)])


def test_an_answers_way_back_delays_the_round_not_the_engine(tmp_path):
    """return_s (the answer's way back, fitted on a live run): the engine runs exactly as before, its rows free
    at each finish; the driver learns of the last finish, so the sync round ends, return_s later."""
    plain, before = run_sync(tmp_path, profile(), [40, 80, 120], 3)
    late, after = run_sync(tmp_path, attrs.evolve(profile(), return_s=0.25), [40, 80, 120], 3)
    assert late["rollout_s"] == pytest.approx(plain["rollout_s"] + 0.25, rel=1e-9)
    assert after == before


def tail_round(tmp_path, **terms) -> dict:
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps({"prompt": f"p{i}", "lengths": [20, 30, 40, 400]}) + "\n" for i in range(8)))
    attrs.evolve(profile(), **terms).save(tmp_path / "p.json")
    config = SimConfig(workload=str(workload), policy="tail", prompts=2, samples=4, max_tokens=512, steps=1,
                       instances=1, engine_profile=str(tmp_path / "p.json"), dataset_prompts=8)
    return Simulation(config).run()["steps"][0]


def test_while_an_answer_is_on_its_way_back_the_tail_decodes_on(tmp_path):
    """A tail round aborts once the driver has the answers it waits for: return_s later, the aborted requests
    have decoded that much further (more tokens wasted), the same tokens kept; a launch latency instead shifts
    the whole round and wastes no more."""
    plain, back, launched = (tail_round(tmp_path, **terms) for terms in ({}, {"return_s": 0.05}, {"launch_s": 0.05}))
    assert plain["round"] == "short" and plain["wasted_tokens"] > 0, "the case under test: a tail was aborted"
    assert back["kept_tokens"] == plain["kept_tokens"] and back["wasted_tokens"] > plain["wasted_tokens"]
    assert back["generated_tokens"] - plain["generated_tokens"] == back["wasted_tokens"] - plain["wasted_tokens"]
    assert (launched["generated_tokens"], launched["wasted_tokens"]) == (plain["generated_tokens"], plain["wasted_tokens"])


def test_each_launched_request_costs_the_engine_submit_s_once_it_reaches_it(tmp_path):
    """submit_s (a launch's handling on cores the engine shares, fitted on a live run): a sync round of 3 launches
    ends 3 x submit_s later, spent by the engine before it prefills; with a launch latency, on arrival."""
    plain, _ = run_sync(tmp_path, profile(), [40, 80, 120], 3)
    charged, intervals = run_sync(tmp_path, attrs.evolve(profile(), submit_s=0.01), [40, 80, 120], 3)
    assert charged["rollout_s"] == pytest.approx(plain["rollout_s"] + 3 * 0.01, rel=1e-9)
    assert sum(b - a for a, b, _, kind in intervals if kind == "submit") == pytest.approx(0.03)
    late, _ = run_sync(tmp_path, attrs.evolve(profile(), submit_s=0.01, launch_s=0.25), [40, 80, 120], 3)
    assert late["rollout_s"] == pytest.approx(plain["rollout_s"] + 0.25 + 3 * 0.01, rel=1e-9)


def test_a_request_moved_between_instances_is_not_charged_a_submission():
    inst = Instance(index=0, cost=attrs.evolve(profile(), submit_s=0.01).cost(), max_running=8, watermark=0.0)
    inst.submit(SimRequest("moved", 10, 10, "stop"), 0.0)
    assert inst.time == 0.0
    inst.submit(SimRequest("launched", 10, 10, "stop"), 0.0, arrives=0.0)
    assert inst.time == pytest.approx(0.01)


def test_a_launched_requests_cost_is_fitted_where_the_rounds_differ_in_launches():
    without, launches, steps, submits = [0.5, 1.5, 1.6, 0.8], [1, 1, 1, 1], [20, 90, 80, 30], [25, 16, 25, 34]
    measured = [w + 0.02 + 0.002 * n + 0.007 * k for w, n, k in zip(without, steps, submits)]
    fitted = fit_live_terms(measured, without, launches, steps, submits=submits)
    assert fitted == pytest.approx({"launch_s": 0.02, "step_s": 0.002, "submit_s": 0.007})


def test_the_answers_way_back_is_the_candidate_whose_tokens_match_the_rounds():
    predicted = {0.0: [100, 200, 50], 0.02: [110, 215, 50], 0.04: [120, 230, 50], 0.06: [130, 245, 50]}
    assert fit_return_s([121, 228, 50], predicted) == 0.04
    assert fit_return_s([90, 180, 50], predicted) == 0.0
    assert fit_return_s([100, 200], {0.06: [100, 200], 0.0: [100, 200]}) == 0.0, "the tokens never tell: 0"


def test_a_request_aborted_before_it_reaches_the_engine_comes_back_with_nothing():
    """A launched request on its way in can be aborted there (no tokens); the others
    join the queue at their arrival time, not before."""
    inst = Instance(index=0, cost=attrs.evolve(profile(), launch_s=0.5).cost(), max_running=8, watermark=0.0)
    for rid in "ab":
        inst.submit(SimRequest(rid, 100, 10, "stop"), 0.0, arrives=0.5)
    assert (len(inst.waiting), len(inst.arriving)) == (0, 2)
    assert inst.remove("a", 0.1).generated == 0 and [r.rid for _, r in inst.arriving] == ["b"]
    inst.arrive(0.4)
    assert not inst.waiting
    inst.arrive(0.5)
    assert [r.rid for r in inst.waiting] == ["b"] and not inst.arriving


def test_the_abort_latency_grows_with_the_requests_one_abort_catches(tmp_path, monkeypatch):
    """abort_request_s (measured by `Calibration.aborts`): an abort call catching n requests on the instance is
    answered abort_s + n * abort_request_s after it, so a tail round ends exactly that much later for its
    largest call (here the driver aborts a group's over-sampled response, then a deferred prompt's three)."""
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps({"prompt": f"p{i}", "lengths": [20, 30, 40, 400]}) + "\n" for i in range(8)))
    calls, abort = [], Simulation.abort
    monkeypatch.setattr(Simulation, "abort", lambda self, rids: (calls.append(len(rids)), abort(self, rids))[1])
    steps = []
    for abort_s, per_request in ((0.0, 0.0), (0.05, 0.1)):
        attrs.evolve(profile(), abort_s=abort_s, abort_request_s=per_request).save(tmp_path / "p.json")
        config = SimConfig(workload=str(workload), policy="tail", prompts=2, samples=4, max_tokens=512, steps=1,
                           instances=1, engine_profile=str(tmp_path / "p.json"), dataset_prompts=8)
        steps += Simulation(config).run()["steps"]
    assert max(calls) >= 2, "the case under test: one abort call catches several requests"
    assert steps[1]["rollout_s"] == pytest.approx(steps[0]["rollout_s"] + 0.05 + 0.1 * max(calls), rel=1e-9)


def test_the_abort_terms_are_fitted_from_latencies_at_several_counts_and_kept_in_the_profile(tmp_path):
    points = [(1, 0.022), (2, 0.030), (4, 0.046), (8, 0.078)]
    fitted = fit_abort(points)
    assert fitted["abort_s"] == pytest.approx(0.014, abs=1e-3) and fitted["abort_request_s"] == pytest.approx(0.008, abs=5e-4)
    kept = fit_profile(timed(TRUE), engine="e", model="m", machine="x", date="d", max_running=8, kv_capacity=10**5,
                       **fitted)
    kept.save(tmp_path / "p.json")
    loaded = load_profile(tmp_path / "p.json")
    assert (loaded.abort_s, loaded.abort_request_s) == (fitted["abort_s"], fitted["abort_request_s"])
    assert loaded.fit["aborts"] == [list(p) for p in points]


@given(contexts=st.lists(st.integers(1, 2000), min_size=1, max_size=12), columns=st.sampled_from([0, 1, 16, 256]),
       steps=st.floats(0.5, 300))
def test_a_padded_decode_attends_every_row_over_the_longest_rows_columns(contexts, columns, steps):
    """`attention_columns` 0: a decode step's context term counts each row's own context (paged attention); m > 0:
    every row attends the longest row's, rounded up to a multiple of m ((m - 1) / 2 on average), as the
    embedded engine's decode does; rows of one context cost the same either way but for the rounding."""
    cost = attrs.evolve(profile(), attention_columns=columns).cost()
    inst = Instance(index=0, cost=cost, max_running=16, watermark=0.0)
    for i, tokens in enumerate(contexts):
        inst.submit(SimRequest(f"r{i}", tokens, 10_000, "stop"), 0.0)
    inst.admit()
    b, c = len(contexts), cost
    attended = b * (max(contexts) + (columns - 1) / 2) if columns else sum(contexts)
    expected = steps * (c.t0 + c.t1 * b + c.t2 * attended) + c.t2 * b * steps * steps / 2
    assert inst._elapsed(steps) == pytest.approx(expected, rel=1e-9)
    assert inst._steps_in(expected) == pytest.approx(steps, rel=1e-6)
