"""The epoch measure: `SimConfig.epochs` runs every policy until each prompt of the dataset is trained
exactly once and none is pending (the pool draws no further), and the stream trainer's semantics."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollpacker.core import ConfigError, SetTensorParallel
from rollpacker.core.prompt_pool import PromptPool
from rollpacker.core.records import PromptKey
from rollpacker.sim import SimConfig, SimConstants, Simulation
from rollpacker.sim.cli import main

POLICIES = [("sync", {}), ("tail", {}), ("tail", {"eta_responses": 1.0}), ("tail", {"predict": True}),
            ("tail", {"long_round_at": 24}), ("partial", {}), ("sorted", {}), ("sorted", {"mode": "partial"})]


def small(**kw) -> SimConfig:
    return SimConfig(**{"prompts": 8, "samples": 4, "max_tokens": 4096, "instances": 2, "dataset_prompts": 40} | kw)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(POLICIES), st.integers(0, 50), st.integers(8, 44), st.integers(1, 2))
def test_every_policy_trains_each_prompt_of_the_epochs_exactly_once(policy_knobs, seed, dataset, epochs):
    policy, knobs = policy_knobs
    sim = Simulation(small(policy=policy, knobs=knobs, seed=seed, dataset_prompts=dataset, epochs=epochs))
    total = sim.run()["total"]
    every = {PromptKey(e, i) for e in range(epochs) for i in range(dataset)}
    assert sim.ledger.trained == every
    assert (total["pending_prompts"], total["lost_prompts"], total["duplicate_prompts"]) == (0, 0, 0)
    assert total["trained_prompts"] == epochs * dataset and total["untrained_prompts"] == 0
    assert total["epoch_s"] == pytest.approx(total["step_s"])
    assert total["step_s_per_batch"] == pytest.approx(total["step_s"] * 8 / (epochs * dataset))


def test_a_fixed_window_leaves_a_backlog_the_epoch_measure_does_not():
    window = Simulation(small(policy="tail", steps=3)).run()["total"]
    epoch = Simulation(small(policy="tail", epochs=1)).run()["total"]
    assert window["pending_prompts"] > 0
    assert epoch["pending_prompts"] == 0 and epoch["steps"] > 3


def test_the_pool_stops_after_its_epochs_and_keeps_the_limit_in_checkpoints():
    pool = PromptPool(num_prompts=5, seed=3, epochs=1)
    pool, keys = pool.take(4)
    assert not pool.exhausted
    pool, more = pool.take(4)
    assert len(more) == 1 and pool.exhausted and {k.index for k in keys + more} == set(range(5))
    assert pool.take(3)[1] == ()
    assert not pool.release(more).exhausted  # a key given back is drawn again
    assert PromptPool.from_dict(pool.to_dict()).epochs == 1
    old = {k: v for k, v in pool.to_dict().items() if k != "epochs"}
    assert PromptPool.from_dict(old).epochs is None
    endless = PromptPool(num_prompts=5).take(7)[1]
    assert [k.epoch for k in endless] == [0] * 5 + [1] * 2


def test_epochs_flag_checked_and_reported(capsys):
    assert main(["--epochs", "0", "--no-progress"]) == 2
    assert "--epochs" in capsys.readouterr().err
    assert main(["--policy", "sync", "--epochs", "1", "--prompts", "8", "--samples", "2", "--max-tokens", "2048",
                 "--instances", "1", "--dataset-prompts", "16", "--no-progress", "--json", "/dev/null"]) == 0
    assert "2 steps" in (err := capsys.readouterr().err) and "pending 0" in err


@pytest.mark.parametrize("policy", ["sync", "tail"])
def test_stream_trainer_is_on_for_every_policy_and_only_the_optimizer_waits(policy):
    steps = Simulation(small(policy=policy, steps=3)).run()["steps"]
    held = attrs.evolve(SimConstants(), train=attrs.evolve(SimConstants().train, stream=False))
    held_steps = Simulation(small(policy=policy, steps=3), held).run()["steps"]
    assert sum(s["train_overlapped_s"] for s in steps) > 0  # micro-batches trained under the round
    assert all(s["train_overlapped_s"] == 0 for s in held_steps)
    for s in steps + held_steps:  # the whole step: switch + rollout + reward wait + exposed training
        assert s["step_s"] == pytest.approx(s["tp_switch_s"] + s["rollout_s"] + s["reward_s"] + s["train_exposed_s"])
        assert s["train_exposed_s"] >= SimConstants().train.optimizer_s * (1 - 1e-9)


def test_tp_switch_seconds_are_in_the_step():
    sim = Simulation(small(policy="tail", tp_mode="plan", instances=4, max_tokens=2048, steps=3))
    switched = [s for s in sim.run()["steps"] if s["tp_switch_s"] > 0]
    for s in switched:
        assert s["step_s"] >= s["tp_switch_s"] + s["rollout_s"]


def test_the_engines_start_at_the_first_rounds_tp_and_only_a_later_switch_costs_tp_switch_s():
    config = small(policy="tail", tp_mode="plan", instances=4, max_tokens=2048, steps=3)
    sim = Simulation(config)
    first = sim.run()["steps"][0]
    assert first["tp"] != config.tp, "the case under test: the plan's first round is not at the setting's TP"
    assert first["tp_switch_s"] == 0.0 and first["step_s"] == pytest.approx(
        first["rollout_s"] + first["reward_s"] + first["train_exposed_s"])
    before = sim.now  # a switch once the run launched: the assumption's seconds, in the step
    sim.set_tensor_parallel(SetTensorParallel(1))
    switch_s = SimConstants().engine.tp_switch_s
    assert switch_s > 0 and sim.now - before == pytest.approx(switch_s) and sim.meter.switch_s == switch_s and sim.tp == 1


def test_epoch_cap_refuses_a_run_that_does_not_drain(monkeypatch):
    monkeypatch.setattr("rollpacker.sim.simulation.epoch_step_cap", lambda config, dataset: 2)
    with pytest.raises(ConfigError, match="--epochs 1: not done after 2 steps"):
        Simulation(small(policy="sync", epochs=1)).run()


@pytest.mark.parametrize("dataset", [40, 44, 47])
def test_tail_runs_the_datasets_last_prompts_in_its_long_rounds_not_in_a_small_short_round(dataset):
    sim = Simulation(small(policy="tail", dataset_prompts=dataset, epochs=1))
    steps = sim.run()["steps"]
    short = [s for s in steps if s["short_rounds"]]
    assert short and all(s["launched_requests"] == 10 * 5 for s in short)  # ceil(1.25 P) prompts x ceil(1.25 R)
    assert steps[-1]["long_rounds"] and sim.ledger.trained == {PromptKey(0, i) for i in range(dataset)}


def test_plot_step_past_an_epoch_runs_steps_is_one_line(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    args = ["--policy", "sync", "--epochs", "1", "--prompts", "8", "--samples", "2", "--max-tokens", "2048",
            "--instances", "1", "--dataset-prompts", "16", "--no-progress", "--json", str(tmp_path / "r.json")]
    assert main(args + ["--plot", str(tmp_path / "p.png"), "--plot-step", "5"]) == 2
    assert "--plot-step 5 is outside 0..1" in capsys.readouterr().err
    assert (tmp_path / "r.json").exists() and not (tmp_path / "p.png").exists()
