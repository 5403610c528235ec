"""Simulator invariants, checked after every event of whole simulated runs."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollpacker.sim import SimConfig, SimConstants, Simulation


class CheckedSimulation(Simulation):
    """Asserts the engine invariants each time the driver settles the instances."""

    def _settle(self) -> None:
        super()._settle()
        seen: dict[str, int] = {}
        for inst in self.instances:
            for rid in list(inst.running) + [r.rid for r in inst.waiting]:
                assert rid not in seen, f"{rid} on instances {seen[rid]} and {inst.index}"
                seen[rid] = inst.index
            assert inst.kv_used() <= inst.capacity * (1 + 1e-9), (inst.index, inst.kv_used(), inst.capacity)
            assert len(inst.running) <= inst.max_running
            exact = sum(r.context(inst.step) for r in inst.running.values())
            assert abs(exact - inst.kv_used()) <= 1e-6 * max(1.0, exact)
        assert set(seen) == set(self.live), "driver and instances disagree on live requests"


def tight_kv(fraction: float) -> SimConstants:
    c = SimConstants()
    return attrs.evolve(c, engine=attrs.evolve(c.engine, mem_fraction=fraction))


def check_run(result: dict, sim: Simulation) -> None:
    for rec in result["steps"]:
        assert rec["lower_bound_rollout_s"] <= rec["rollout_s"] * (1 + 1e-9)
        assert 0.0 < rec["floor_s"] <= rec["rollout_s"] * (1 + 1e-9)
        assert rec["floor_s"] == max(rec["floor_work_s"], rec["floor_path_s"])
        assert 0.0 <= rec["idle_ratio"] <= 1.0  # busy time <= wall time x instances
        assert 0.0 <= rec["bubble_ratio"] <= 1.0
        assert rec["reward_s"] >= 0 and rec["train_s"] >= 0
        assert rec["lost_prompts"] == 0 and rec["duplicate_prompts"] == 0
        assert rec["trained_prompts"] == sim.config.prompts
    for inst in sim.instances:
        assert inst.busy_s <= sim.meter.rollout_end - sim.meter.start + 1e-6
    total = result["total"]
    assert total["lost_prompts"] == 0 and total["duplicate_prompts"] == 0
    assert total["trained_prompts"] == sim.config.prompts * sim.config.steps


POLICIES = [("sync", {}), ("tail", {}), ("tail", {"eta_responses": 1.0}), ("tail", {"predict": True}),
            ("tail", {"defer_at": 0.75, "longest_first": True}),
            ("sorted", {}), ("sorted", {"mode": "partial"}), ("partial", {})]


@pytest.mark.parametrize("policy,knobs", POLICIES)
def test_policies_keep_invariants_with_preemption(policy, knobs):
    config = SimConfig(policy=policy, knobs=knobs, prompts=16, samples=4, max_tokens=8192, steps=6,
                       instances=1, tp=4, model="qwen2.5-32b", seed=3)
    sim = CheckedSimulation(config, tight_kv(0.21))
    result = sim.run()
    check_run(result, sim)
    assert result["total"]["preemptions"] > 0  # the tight pool really preempts


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), policy=st.sampled_from([p for p, _ in POLICIES]),
       instances=st.integers(1, 4), fraction=st.sampled_from([0.21, 0.5, 0.85]),
       workload=st.sampled_from(["servegen-r1", "azure-conv"]))
def test_random_configs_keep_invariants(seed, policy, instances, fraction, workload):
    config = SimConfig(policy=policy, prompts=8, samples=4, max_tokens=4096, steps=3, instances=instances,
                       tp=4, model="qwen2.5-32b", seed=seed, workload=workload)
    sim = CheckedSimulation(config, tight_kv(fraction))
    check_run(sim.run(), sim)


def test_same_seed_same_result():
    config = SimConfig(policy="tail", prompts=16, samples=4, steps=3, instances=4)
    a, b = Simulation(config).run(), Simulation(config).run()
    assert a["steps"] == b["steps"]


def test_tail_over_launch_biases_groups_short_and_unbiased_mode_does_not():
    base = dict(prompts=32, samples=8, max_tokens=8192, steps=4, instances=4, seed=1)
    biased = Simulation(SimConfig(policy="tail", **base)).run()["steps"]
    short = [s for s in biased if s["round"] == "short"]
    assert all(s["mean_kept_length"] < s["mean_generated_length"] * 1.5 for s in short)
    assert sum(s["mean_kept_length"] for s in short) < sum(s["mean_generated_length"] for s in short) * 1.2


def test_paper_scale_32k_step_on_64_gpus():
    """One 32k step of 128 x 8 on 16 TP4 instances (its speed is measured in benchmarks/, not here)."""
    config = SimConfig(policy="sync", prompts=128, samples=8, max_tokens=32768, steps=1, instances=16, tp=4,
                       model="qwen2.5-32b")
    sim = Simulation(config)
    result = sim.run()
    check_run(result, sim)
    assert result["steps"][0]["trained_prompts"] == 128


def test_floor_is_the_same_engine_for_every_policy_and_below_each():
    """The floor does not move with the policy, its TP rule or speculation: sync at TP1 without
    speculation and tail with planned TP and speculation share one (same model, same GPUs), and
    every step of both is above it."""
    base = dict(prompts=16, samples=4, max_tokens=8192, steps=4, seed=2, model="qwen2.5-7b")
    spec = SimConstants()
    spec = attrs.evolve(spec, spec=attrs.evolve(spec.spec, enabled=True))
    plain = Simulation(SimConfig(policy="sync", instances=8, tp=1, **base))
    best = Simulation(SimConfig(policy="tail", instances=2, tp=4, tp_mode="plan", **base), spec)
    assert plain.floor == best.floor
    for sim in (plain, best):
        check_run(sim.run(), sim)


class PlacementWatch(CheckedSimulation):
    """Notes, at each launch, the instance it went to and the instances with the fewest true tokens
    left and with the fewest requests."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.placements: list[tuple[int, set[int], set[int]]] = []

    def _launch(self, cmd) -> None:
        left = {i.index: sum(r.target - r.tokens(i.step) for r in (*i.running.values(), *i.waiting))
                for i in self.instances}
        count = {i.index: len(i.running) + len(i.waiting) for i in self.instances}
        super()._launch(cmd)
        self.placements.append((self.where[cmd.request_id].index,
                                {k for k, v in left.items() if v == min(left.values())},
                                {k for k, v in count.items() if v == min(count.values())}))


def test_oracle_placement_sends_each_launch_to_the_instance_with_the_fewest_tokens_left():
    """engine.oracle_placement (a measurement's upper bound): the fewest true tokens left, not the
    fewest requests, decides; the runs keep every invariant."""
    c = SimConstants()
    config = SimConfig(policy="tail", prompts=16, samples=4, max_tokens=8192, steps=4, instances=4, tp=1,
                       model="qwen2.5-7b", seed=5)
    oracle = PlacementWatch(config, attrs.evolve(c, engine=attrs.evolve(c.engine, oracle_placement=True)))
    check_run(oracle.run(), oracle)
    assert all(at in fewest_tokens for at, fewest_tokens, _ in oracle.placements)
    assert any(at not in fewest_requests for at, _, fewest_requests in oracle.placements), "the knob changed nothing"
    plain = PlacementWatch(config, c)
    check_run(plain.run(), plain)
    assert all(at in fewest_requests for at, _, fewest_requests in plain.placements)


class IsolationWatch(CheckedSimulation):
    """Checks, after each launch batch, where the batch's longest requests went."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.isolated_batches = 0

    def launch(self, commands) -> None:
        super().launch(commands)
        m = self.constants.engine.oracle_isolate
        if len(commands) <= len(self.instances):
            return
        longest = sorted((c.request_id for c in commands), key=lambda rid: -self.live[rid].target)[:m]
        for rid, inst in zip(longest, self.instances):
            assert [r.rid for r in (*inst.running.values(), *inst.waiting)] == [rid], "alone on its instance"
        self.isolated_batches += 1


def test_oracle_isolation_gives_each_of_a_batchs_longest_requests_an_instance_of_its_own():
    c = SimConstants()
    config = SimConfig(policy="tail", prompts=16, samples=4, max_tokens=8192, steps=4, instances=4, tp=1,
                       model="qwen2.5-7b", seed=5)
    sim = IsolationWatch(config, attrs.evolve(c, engine=attrs.evolve(c.engine, oracle_isolate=2)))
    check_run(sim.run(), sim)
    assert sim.isolated_batches > 0, "the case under test: batches larger than the fleet"


class RedispatchWatch(CheckedSimulation):
    """Checks the instances' request counts after each settle, and counts the moves."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.moves = 0

    def _move(self, rid, source, to) -> None:
        self.moves += 1
        super()._move(rid, source, to)

    def _settle(self) -> None:
        super()._settle()
        loads = [len(i.running) + len(i.waiting) for i in self.instances]
        assert max(loads) - min(loads) <= 1, loads


def test_redispatch_keeps_every_instances_request_count_within_one_and_every_invariant():
    c = SimConstants()
    config = SimConfig(policy="tail", prompts=16, samples=4, max_tokens=8192, steps=4, instances=4, tp=1,
                       model="qwen2.5-7b", seed=5)
    sim = RedispatchWatch(config, attrs.evolve(c, engine=attrs.evolve(c.engine, redispatch=True)))
    check_run(sim.run(), sim)
    assert sim.moves > 0, "the case under test: requests that finish unevenly across instances"
