"""An engine profile from single forwards timed alone (`decode_rows`: the embedded engine's decode steps by rows,
its prefill by tokens): the simulator charges a step the table's cost, the grid's runs fit only what the forwards
leave out, and the real engine's forwards are timed on its loop thread only while it is idle."""

from __future__ import annotations

import json
import time
from pathlib import Path

import attrs
import pytest
from devices import DEVICES
from hypothesis import given
from hypothesis import strategies as st

from rollpacker.core.errors import ConfigError
from rollpacker.sim.engine_profile import Run, fit_profile, forward_terms, load_profile, rows_seconds

TABLE = [[1, 0.038], [2, 0.067], [4, 0.062], [8, 0.066], [16, 0.083]]
"""A decode table shaped like the default model's on 2 CPU cores (seconds at 1, 2, 4, 8 and 16 rows)."""
FORWARDS = {"context": 32, "long_context": 128, "decode": TABLE,
            "decode_long": [[b, s + 1e-6 * b * 96] for b, s in TABLE],  # t2: 1 us a token of context
            "prefill": [[16, 0.045 + 16 * 0.00125], [32, 0.045 + 32 * 0.00125], [128, 0.045 + 128 * 0.00125]]}
LOOP = {"run_overhead_s": 0.02, "loop_s": 0.003, "t1": 0.0002}
GRID = [(b, p, n) for b in (1, 4, 8, 16) for p in (32, 128) for n in (8, 32)]


def profile(loop=LOOP, forwards=FORWARDS):
    truth = fit_profile([Run(b, 32, 8, 1.0) for b in (1, 4, 16)], engine="e", model="m", machine="x", date="d", max_running=16,
                        kv_capacity=10**6, forwards=forwards)
    truth = attrs.evolve(truth, **loop)
    runs = [Run(b, p, n, truth.predict(Run(b, p, n, 0.0))) for b, p, n in GRID]
    return fit_profile(runs, engine="e", model="m", machine="x", date="d", max_running=16, kv_capacity=10**6,
                       forwards=forwards)


def test_the_forwards_give_the_decode_and_prefill_and_the_grid_what_they_leave_out(tmp_path):
    fitted = profile()
    assert fitted.decode_rows == TABLE and fitted.decode_context == 32
    assert fitted.t0 == pytest.approx(0.045) and fitted.prefill_t1 == pytest.approx(0.00125)
    assert fitted.t2 == pytest.approx(1e-6)
    for term, value in LOOP.items():
        assert getattr(fitted, term) == pytest.approx(value, rel=1e-6, abs=1e-9), term
    assert fitted.fit["max_abs_error"] < 1e-9 and fitted.fit["forwards"] == FORWARDS
    fitted.save(tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json") == fitted


@given(rows=st.floats(0.5, 20.0), context=st.floats(0.0, 5000.0), step_s=st.floats(0.0, 0.05))
def test_a_decode_step_costs_the_tables_seconds_at_its_rows_plus_the_loops_and_its_extra_context(rows, context, step_s):
    cost = attrs.evolve(profile(), step_s=step_s).cost()
    expected = rows_seconds(TABLE, rows) + LOOP["loop_s"] + step_s + LOOP["t1"] * rows + 1e-6 * (context - rows * 32)
    assert cost.step_time(rows, context) == pytest.approx(expected, abs=1e-9)
    assert cost.prefill_batch_s == pytest.approx(0.045)  # an admission's fixed cost is the prefill's, not a step's


def test_the_table_is_linear_between_its_points_and_flat_beyond_them():
    assert rows_seconds(TABLE, 2) == 0.067 and rows_seconds(TABLE, 3) == pytest.approx(0.0645)
    assert rows_seconds(TABLE, 12) == pytest.approx(0.0745) and rows_seconds(TABLE, 40) == 0.083
    assert rows_seconds(TABLE, 0.5) == 0.038


def test_a_longer_context_that_times_faster_gives_no_negative_context_cost():
    noisy = {**FORWARDS, "decode_long": [[b, s - 0.001] for b, s in TABLE]}
    assert forward_terms(noisy)["t2"] == 0.0


@pytest.fixture(scope="module")
def engine():
    from rollpacker.backends.embedded.engine import EmbeddedEngine
    from rollpacker.backends.models import load_model, tiny_random_llama

    model, _ = load_model(tiny_random_llama())
    with EmbeddedEngine(model, capacity=8, stop_token_ids=(), kv_tokens_per_row=256) as engine:
        yield engine


@pytest.mark.timeout(300)
@pytest.mark.parametrize("device", DEVICES)
def test_the_real_engine_times_each_rows_count_and_prompt_and_then_generates_as_before(device):
    """On CUDA the engine replays its captured decode graphs: the timed steps are the ones a round runs."""
    from rollpacker.backends.embedded.engine import EmbeddedEngine
    from rollpacker.backends.models import load_model, tiny_random_llama

    model, _ = load_model(tiny_random_llama(), device=device)
    with EmbeddedEngine(model, capacity=8, stop_token_ids=(), kv_tokens_per_row=128) as engine:
        check_times_then_generate(engine)


def check_times_then_generate(engine) -> None:
    from rollpacker.core.protocols import GenerationRequest, GenerationResult

    times = engine.time_forwards(rows=(1, 3, 8), context=16, long_context=64, prompts=(16, 64), repeats=3)
    assert [b for b, _ in times.decode] == [b for b, _ in times.decode_long] == [1, 3, 8]
    assert [p for p, _ in times.prefill] == [16, 64]
    assert all(0 < s < 5 for _, s in times.decode + times.decode_long + times.prefill)
    assert times.decode[-1][1] > 0.5 * times.decode[0][1], "8 rows are not much quicker than 1"
    engine.submit([GenerationRequest("after", (5, 6, 7), 4, ignore_eos=True)])
    deadline, results = time.monotonic() + 60, []
    while not results and time.monotonic() < deadline:
        results = [r for r in engine.poll(0.05) if isinstance(r, GenerationResult)]
    assert results and len(results[0].token_ids) == 4 and results[0].finish_reason == "length"


@pytest.mark.timeout(300)
def test_the_real_engine_refuses_to_time_forwards_while_busy_or_past_its_capacity(engine):
    from rollpacker.core.protocols import GenerationRequest, GenerationResult

    with pytest.raises(ConfigError, match="9 rows is more than the engine's capacity 8"):
        engine.time_forwards(rows=(9,), context=16, long_context=32, prompts=(16,))
    engine.submit([GenerationRequest("busy", (5, 6, 7), 200, ignore_eos=True)])
    with pytest.raises(ConfigError, match="requests are in flight"):
        engine.time_forwards(rows=(1,), context=16, long_context=32, prompts=(16,))
    engine.abort(["busy"])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(isinstance(r, GenerationResult) for r in engine.poll(0.05)):
        pass


DEFAULT_4 = Path(__file__).resolve().parents[1] / "benchmarks" / "sim_vs_real" / "embedded-default-4.json"
AS_MEASURED = ({"sync": 0.099, "tail": 0.058, "sorted": 0.224}, {"tail": 0.005, "sorted": 0.078})
WITH_ITS_FORWARDS = ({"sync": 0.099, "tail": 0.157, "sorted": 0.12}, {"tail": 0.024, "sorted": 0.040})
"""The default model measured a fourth time (2 seeds, this machine), its calibration having timed the forwards and
kept a line in rows (the grid's median error 5.1% against 8.5%): sync/tail +0.4%, sync/SortedRL -7.8%, rounds sync
7.9-9.8%, tail 5.5-5.7%, SortedRL 13.4-22.3%.  Refitted with its own forwards: +2.4%, -4.0%, rounds 7.9-9.8%,
11.7-15.6%, 10.2-11.9%.  Regression bounds."""


@pytest.mark.timeout(600)
def test_the_default_model_refitted_with_its_forwards_takes_their_table_and_stays_within_what_it_met(tmp_path):
    """Through the live path: the measurement's calibration timed the engine's forwards and kept them; refitted
    with them (`--refit-forwards`), the profile's decode steps are their table and its rounds (SortedRL's within
    12%) within the bounds above."""
    import sys

    sys.path.insert(0, str(DEFAULT_4.parents[2] / "benchmarks"))
    import sim_vs_real
    from test_sim_vs_real import assert_within

    result = json.loads(DEFAULT_4.read_text())
    forwards = result["profile"]["fit"]["forwards_not_used"]
    assert not result["profile"]["decode_rows"] and [b for b, _ in forwards["decode"]] == [1, 2, 3, 4, 6, 8, 12, 16]
    assert_within(sim_vs_real.repredict(result, tmp_path), *AS_MEASURED)
    assert not sim_vs_real.refit(result, tmp_path)["profile"]["decode_rows"], "a refit keeps the calibration's choice"
    again = sim_vs_real.refit(result, tmp_path, forwards=True)
    assert again["profile"]["decode_rows"] == [[b, round(s, 5)] for b, s in forwards["decode"]]
    assert again["profile"]["decode_context"] == 32
    assert_within(sim_vs_real.repredict(again, tmp_path), *WITH_ITS_FORWARDS)


DEFAULT_5 = DEFAULT_4.with_name("embedded-default-5.json")
FIFTH = ({"sync": 0.119, "tail": 0.106, "sorted": 0.114}, {"tail": 0.001, "sorted": 0.028})
SIXTH = ({"sync": 0.075, "tail": 0.148, "sorted": 0.105}, {"tail": 0.048, "sorted": 0.105})
"""A sixth time, the same way (grid 3.7% against a line's 7.4%): rounds sync 4.0-7.5%, tail 4.8-14.7%, SortedRL
7.9-10.5%, sync/tail +4.7%, sync/SortedRL +10.4% (missed by 0.4 points: seed 0's trainer stage took 9.5 s
against 7.3 predicted, its rollout within 9.8%)."""
"""The default model measured a fifth time, its profile's decode steps timed alone (its calibration's grid: 4.7%
median error against a line's 6.0%): every target met, sync/tail -0.0%, sync/SortedRL -2.7%, rounds sync 11.5-11.9%, tail
8.6-10.6%, SortedRL 8.0-11.4% (the fourth and the third, measured with a line in rows, missed SortedRL's rounds:
up to 22.3% and 26.5%).  Regression bounds."""


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name,bounds", [("embedded-default-5.json", FIFTH), ("embedded-default-6.json", SIXTH)])
def test_the_default_model_measured_with_its_forwards_timed_stays_within_what_it_met(tmp_path, name, bounds):
    import sys

    sys.path.insert(0, str(DEFAULT_5.parents[2] / "benchmarks"))
    import sim_vs_real
    from test_sim_vs_real import assert_within

    result = json.loads(DEFAULT_5.with_name(name).read_text())
    profile = result["profile"]
    assert [b for b, _ in profile["decode_rows"]] == [1, 2, 3, 4, 6, 8, 12, 16]
    assert profile["fit"]["line_median_abs_error"] > profile["fit"]["median_abs_error"]
    assert_within(sim_vs_real.repredict(result, tmp_path), *bounds)
