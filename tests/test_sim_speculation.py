"""Speculative decoding in the simulator's tail, the synthetic workload, tail latency and length bias."""

from __future__ import annotations

import json

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollpacker.core import ConfigError
from rollpacker.core.cost_model import CostModel
from rollpacker.sim import MODELS, SimConfig, SimConstants, Simulation
from rollpacker.sim.bias import expected_reward
from rollpacker.sim.constants import H100
from rollpacker.sim.speculation import MEASURED, TABLE, SpecConstants, measured_table
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
    fixed = SpecConstants(enabled=True, acceptance=0.55)
    assert 1 / fixed.slowdown(COST, 1) == pytest.approx(fixed.accepted_per_step(), rel=0.05)
    assert fixed.accepted_per_step() == pytest.approx((1 - 0.55 ** 5) / (1 - 0.55))


def test_default_is_the_measured_table_and_the_engines_own_row_limit():
    """By default the simulator speculates as the engine does (at most SPEC_MAX_ROWS_CUDA = 4 rows)
    and reads acceptance from the measured table by finished-sibling share."""
    from rollpacker.backends.embedded.speculation import SPEC_MAX_ROWS_CUDA
    table = measured_table()
    assert ON.max_rows == SPEC_MAX_ROWS_CUDA and ON.acceptance == MEASURED
    assert ON.slowdown(COST, SPEC_MAX_ROWS_CUDA + 1) == 1.0
    for lo, _, accepted in table.buckets:
        assert ON.accepted_per_step(lo) == pytest.approx(1.0 + accepted)
    assert ON.best_slowdown(COST) == min(ON.slowdown(COST, 1, lo) for lo, _, _ in table.buckets)
    data = json.loads(TABLE.read_text())
    assert {"command", "prompts", "group", "requests", "caps", "model"} <= set(data)
    assert set(data["caps"]) == {"512", "2048"}


def test_a_missing_table_and_another_k_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the measured acceptance table"):
        measured_table(tmp_path / "none.json")
    with pytest.raises(ConfigError, match="spec.draft_tokens 8: the measured acceptance table is for 4"):
        SpecConstants(draft_tokens=8)
    assert SpecConstants(draft_tokens=8, acceptance=0.5).accepted_per_step() > 1.0


class ShareProbe(CheckedSimulation):
    """Records the finished-sibling share each speculating instance gets between segments."""

    def _settle(self) -> None:
        super()._settle()
        self.shares = getattr(self, "shares", [])
        self.shares += [(inst.batch, inst.spec_share) for inst in self.instances if inst.batch]


def test_speculating_instances_see_their_siblings_finish():
    """The tail of a round runs requests whose siblings have mostly finished: the share the
    acceptance is read at rises to 1 there, and stays 0 where speculation is off (more rows)."""
    config = SimConfig(policy="sync", prompts=8, samples=4, max_tokens=8192, steps=2, instances=2, seed=1)
    sim = ShareProbe(config, with_spec(SimConstants()))
    check_run(sim.run(), sim)
    assert all(share == 0.0 for batch, share in sim.shares if batch > ON.max_rows)
    small = [share for batch, share in sim.shares if batch <= ON.max_rows]
    assert small and max(small) == 1.0 and all(0.0 <= s <= 1.0 for s in small)


@pytest.mark.parametrize("bad", [{"acceptance": 1.0}, {"acceptance": -0.1}, {"acceptance": -2.0}, {"draft_tokens": -1}, {"max_rows": 1.5}])
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
    # Speculation runs only at <= 4 rows an instance (the engine's rule): a round that the policy
    # aborts before any instance gets there is no faster, never slower.
    assert fast["mean_rollout_s"] <= plain["mean_rollout_s"]
    if policy == "sync":
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
