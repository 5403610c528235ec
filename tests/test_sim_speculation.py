"""Speculative decoding in the simulator's tail, the synthetic workload, tail latency and length bias."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollpacker.core import ConfigError
from rollpacker.core.cost_model import CostModel
from rollpacker.sim import MODELS, SimConfig, SimConstants, Simulation
from rollpacker.sim.bias import expected_reward
from rollpacker.sim.constants import H100
from rollpacker.sim.speculation import SpecConstants
from test_sim_invariants import CheckedSimulation, check_run, tight_kv

COST = CostModel(model=MODELS["qwen2.5-7b"], hardware=H100, tp=1, mem_fraction=0.85)
ON = SpecConstants(enabled=True)


def with_spec(constants: SimConstants, **spec) -> SimConstants:
    return attrs.evolve(constants, spec=attrs.evolve(constants.spec, enabled=True, **spec))


@given(batch=st.integers(1, 2048), acceptance=st.floats(0.0, 0.95), drafts=st.integers(0, 8),
       max_rows=st.integers(0, 64))
def test_slowdown_is_at_most_one_and_off_above_max_rows(batch, acceptance, drafts, max_rows):
    spec = SpecConstants(enabled=True, acceptance=acceptance, draft_tokens=drafts, max_rows=max_rows)
    factor = spec.slowdown(COST, batch)
    assert 0.0 < factor <= 1.0
    if batch > max_rows or drafts == 0:
        assert factor == 1.0
    assert SpecConstants(enabled=False, acceptance=acceptance).slowdown(COST, batch) == 1.0


@given(batch=st.integers(1, 31))
def test_slowdown_grows_with_the_batch(batch):
    assert ON.slowdown(COST, batch) <= ON.slowdown(COST, batch + 1)


def test_small_batch_speedup_matches_the_accepted_length():
    # at batch 1 a verify step of 5 tokens costs about one decode step: speed-up ~ accepted tokens
    assert 1 / ON.slowdown(COST, 1) == pytest.approx(ON.accepted_per_step(), rel=0.05)
    a = ON.acceptance
    assert ON.accepted_per_step() == pytest.approx((1 - a ** 5) / (1 - a))


@pytest.mark.parametrize("bad", [{"acceptance": 1.0}, {"acceptance": -0.1}, {"draft_tokens": -1}, {"max_rows": 1.5}])
def test_bad_spec_constants_name_the_field(bad):
    with pytest.raises(ConfigError, match=f"spec.{next(iter(bad))}"):
        SpecConstants(**bad)


@pytest.mark.parametrize("policy,knobs", [("tail", {}), ("sync", {}), ("tail", {"defer_at": 0.8}),
                                          ("sorted", {}), ("partial", {})])
def test_speculation_keeps_invariants_and_only_speeds_up(policy, knobs):
    config = SimConfig(policy=policy, knobs=knobs, prompts=16, samples=4, max_tokens=8192, steps=5,
                       instances=2, tp=4, model="qwen2.5-32b", seed=5)
    plain = Simulation(config, tight_kv(0.3)).run()["total"]
    sim = CheckedSimulation(config, with_spec(tight_kv(0.3)))
    result = sim.run()
    check_run(result, sim)
    fast = result["total"]
    assert fast["mean_rollout_s"] < plain["mean_rollout_s"]
    if policy != "partial":  # lossless speculation keeps on-policy policies strictly on-policy
        assert fast["on_policy_fraction"] == plain["on_policy_fraction"] == 1.0
    assert fast["trained_prompts"] == plain["trained_prompts"] == 16 * 5


def test_tail_latency_and_tokens_per_s_are_consistent():
    config = SimConfig(policy="sync", prompts=16, samples=4, max_tokens=8192, steps=3, instances=4, seed=2)
    result = Simulation(config).run()
    for rec in result["steps"]:
        assert 0.0 <= rec["tail_s"] <= rec["rollout_s"]
        assert rec["tokens_per_s"] == pytest.approx(rec["generated_tokens"] / rec["rollout_s"])
    assert result["total"]["mean_tail_s"] > 0


def test_bias_sync_keeps_what_it_launches_tail_keeps_shorter():
    base = dict(prompts=32, samples=8, max_tokens=8192, steps=4, instances=4, seed=1)
    sync = Simulation(SimConfig(policy="sync", **base)).run()["total"]
    assert sync["kept_mean_length"] == pytest.approx(sync["launched_mean_length"])
    assert sync["kept_mean_reward"] == pytest.approx(sync["launched_mean_reward"])
    tail = Simulation(SimConfig(policy="tail", **base)).run()["total"]
    assert tail["kept_mean_length"] < tail["launched_mean_length"]
    assert tail["kept_mean_reward"] > tail["launched_mean_reward"]


def test_stand_in_reward_falls_with_length_and_is_zero_when_truncated():
    assert list(expected_reward([0, 512, 1024], 1024)) == [1.0, 0.5, 0.0]


@pytest.mark.parametrize("policy", ["sync", "tail", "sorted", "partial"])
def test_synthetic_bimodal_keeps_invariants(policy):
    config = SimConfig(workload="synthetic-bimodal", policy=policy, prompts=8, samples=4, max_tokens=4096,
                       steps=4, instances=2, tp=4, model="qwen2.5-32b", seed=4)
    sim = CheckedSimulation(config, tight_kv(0.5))
    check_run(sim.run(), sim)
