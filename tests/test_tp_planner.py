"""TP planner: cost model figures against LATENCY.md, the makespan rule, and the online rule."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollpacker.core import ConfigError, LaunchRequest, Scheduler, SetTensorParallel, TpRule, make_policy
from rollpacker.core.cost_model import CostModel
from rollpacker.core.cost_model import ModelShape
from rollpacker.core.tp_planner import OnlineTP, feasible_tps, plan_tp, predict_makespan, valid_tps
from rollpacker.sim.constants import H100, MODELS


@pytest.mark.parametrize("model,tp,t0_ms,t1_us,cap_k", [
    ("qwen2.5-7b", 1, 6.94, 23.6, 994), ("qwen2.5-14b", 2, 8.55, 23.3, 585), ("qwen2.5-32b", 4, 10.47, 26.7, 852),
])
def test_cost_model_reproduces_latency_table(model, tp, t0_ms, t1_us, cap_k):
    cost = CostModel(model=MODELS[model], hardware=H100, tp=tp, mem_fraction=0.85)
    assert cost.t0 * 1e3 == pytest.approx(t0_ms, rel=0.02)
    if tp == 1:  # at TP > 1 our t1 adds GEMM inefficiency and all-reduce traffic (cost_model.py)
        assert cost.t1 * 1e6 == pytest.approx(t1_us, rel=0.02)
    else:
        assert t1_us * 1e-6 < cost.t1 < 1.35 * t1_us * 1e-6
    assert cost.kv_capacity / 1e3 == pytest.approx(cap_k, rel=0.01)


def test_latency_bound_tail_picks_larger_tp_throughput_bound_smaller():
    rng = np.random.default_rng(0)
    long = np.minimum(rng.lognormal(8.5, 1.0, 1024), 32768)
    choice = plan_tp(MODELS["qwen2.5-32b"], H100, 64, 0.5, long, 500, 34816)
    assert choice.tp >= 4
    # Throughput-bound (many requests of equal length): small TP, more instances.
    choice = plan_tp(MODELS["qwen2.5-7b"], H100, 16, 0.85, np.full(16384, 1000.0), 300, 10240)
    assert choice.tp <= 2
    assert choice.makespan_s == min(m for _, m in choice.options)


def test_infeasible_is_a_config_error():
    assert feasible_tps(MODELS["qwen2.5-32b"], H100, 8, 0.5, 34816, (1,)) == []
    with pytest.raises(ConfigError, match="does not fit"):
        plan_tp(MODELS["qwen2.5-32b"], H100, 8, 0.5, [100], 100, 34816, candidates=(1,))


@given(st.lists(st.integers(1, 20000), min_size=1, max_size=200), st.integers(1, 8))
def test_makespan_at_least_the_longest_request_alone(lengths, instances):
    cost = CostModel(model=MODELS["qwen2.5-7b"], hardware=H100, tp=1, mem_fraction=0.85)
    m = predict_makespan(cost, lengths, 200, instances)
    assert m >= max(lengths) * cost.t0 * (1 - 1e-9)
    assert predict_makespan(cost, lengths, 200, instances + 1) <= m * (1 + 1e-9)


def test_online_rule_doubles_on_jump_and_halves_after_quiet_steps():
    s = OnlineTP(tp=2, min_tp=1, max_tp=8)
    s = s.observe(100)          # first observation: a baseline, no change
    assert s.tp == 2
    s = s.observe(104)          # +4%: below the 1.05x jump
    assert s.tp == 2
    s = s.observe(120)          # +15%: double
    assert s.tp == 4
    for _ in range(3):
        s = s.observe(0)
    assert s.tp == 4
    s = s.observe(0)            # 4 quiet steps: halve
    assert s.tp == 2
    assert OnlineTP(tp=8, max_tp=8, last=1).observe(10).tp == 8  # capped


def test_online_rule_rejects_bad_values():
    with pytest.raises(ConfigError):
        OnlineTP(tp=3)
    with pytest.raises(ConfigError):
        OnlineTP(tp=2).observe(-1)


def _rule(mode: str, tp: int = 1, gpus: int = 8) -> TpRule:
    return TpRule(mode=mode, tp=tp, model=MODELS["qwen2.5-32b"], hardware=H100, gpus=gpus, mem_fraction=0.5,
                  max_context=34816, prompt_tokens=(500,) * 64, unseen_length=20000.0)


def test_scheduler_asks_for_a_tp_change_before_the_rounds_launches_and_only_on_a_change():
    """32B with 32k contexts cannot even hold one request at TP1 on half the memory: the plan rule
    moves to a feasible TP before the first launch, then keeps it (no command) while it stays best."""
    sched = Scheduler(make_policy("sync", prompts=8, samples=4, max_tokens=32768), num_prompts=64, tp=_rule("plan"))
    first = sched.begin_round()
    assert isinstance(first[0], SetTensorParallel) and first[0].tp in _rule("plan").feasible()
    assert all(isinstance(c, LaunchRequest) for c in first[1:]) and len(first) == 1 + 8 * 4
    assert sched.tp == first[0].tp
    sched.step_done = True  # (a fresh round with the same predictions)
    sched.state = Scheduler(make_policy("sync", prompts=8, samples=4, max_tokens=32768), num_prompts=64).state
    assert not any(isinstance(c, SetTensorParallel) for c in sched.begin_round())


def test_scheduler_online_tp_follows_observed_preemptions():
    sched = Scheduler(make_policy("sync", prompts=2, samples=2, max_tokens=64), num_prompts=8,
                      tp=_rule("online", tp=2))
    assert not any(isinstance(c, SetTensorParallel) for c in sched.begin_round())  # starts where it is
    sched.observe_preemptions(100)
    sched.observe_preemptions(200)  # doubled: the next round runs at TP4
    sched.step_done, sched.state = True, Scheduler(make_policy("sync", prompts=2, samples=2, max_tokens=64),
                                                   num_prompts=8).state
    assert sched.begin_round()[0] == SetTensorParallel(4)


def test_fixed_tp_and_no_rule_never_ask_and_a_live_backend_refuses_a_change():
    for rule in (None, _rule("fixed", tp=4)):
        sched = Scheduler(make_policy("sync", prompts=2, samples=2, max_tokens=64), num_prompts=8, tp=rule)
        sched.observe_preemptions(10)
        assert not any(isinstance(c, SetTensorParallel) for c in sched.begin_round())
    from rollpacker.driver import LiveBackend, VirtualClock
    live = LiveBackend(sched, None, None, None, None, VirtualClock())
    with pytest.raises(ConfigError, match="TpRule"):
        live.set_tensor_parallel(SetTensorParallel(2))


def test_model_table_head_counts_and_their_valid_tps():
    """num_attention_heads / num_key_value_heads of the model cards, and the TPs they allow."""
    expect = {"qwen2.5-7b": (28, 4, [1, 2, 4]), "qwen2.5-14b": (40, 8, [1, 2, 4, 8]),
              "qwen2.5-32b": (40, 8, [1, 2, 4, 8]), "llama3.1-8b": (32, 8, [1, 2, 4, 8])}
    for name, (heads, kv, tps) in expect.items():
        m = MODELS[name]
        assert (m.heads, m.kv_heads) == (heads, kv)
        assert valid_tps(m, H100, 64) == tps


def test_plan_never_picks_tp8_for_qwen_7b():
    """Qwen2.5-7B's 4 KV heads cannot be split 8 ways: the long 32k round that favours the largest
    TP gets 4 (before the head rule, the planner named 8)."""
    long = np.full(64, 32000.0)
    choice = plan_tp(MODELS["qwen2.5-7b"], H100, 64, 0.85, long, 500, 34816)
    assert choice.tp == 4 and 8 not in dict(choice.options)


def test_rule_refuses_an_invalid_starting_tp():
    with pytest.raises(ConfigError, match="tp 8 is not a valid tensor-parallel size for Qwen2.5-7B"):
        TpRule(mode="fixed", tp=8, model=MODELS["qwen2.5-7b"], hardware=H100, gpus=64, mem_fraction=0.85,
               max_context=10240, prompt_tokens=(100,), unseen_length=100.0)


shapes = st.builds(
    lambda kv, group, layers: ModelShape(name="m", hidden=128 * kv * group, layers=layers, heads=kv * group,
                                         kv_heads=kv, head_dim=128, weight_bytes=layers * 0.5e9,
                                         read_bytes=layers * 0.5e9),
    st.integers(1, 12), st.integers(1, 8), st.integers(2, 64))


@given(shapes, st.sampled_from([1, 2, 4, 8, 16, 24, 64]), st.lists(st.integers(1, 40000), min_size=1, max_size=64),
       st.sampled_from([0.5, 0.85]))
def test_no_plan_ever_names_an_invalid_tp(model, gpus, lengths, mem_fraction):
    try:
        choice = plan_tp(model, H100, gpus, mem_fraction, lengths, 300, max(lengths) + 300)
    except ConfigError:
        assert feasible_tps(model, H100, gpus, mem_fraction, max(lengths) + 300) == []
        return
    for tp in [choice.tp] + [tp for tp, _ in choice.options]:
        assert model.heads % tp == 0 and model.kv_heads % tp == 0 and gpus % tp == 0 and tp <= H100.gpus_per_node


@given(st.lists(st.integers(1, 32000), min_size=1, max_size=64), st.sampled_from([1, 2, 4]),
       st.floats(0, 600, allow_nan=False))
def test_the_plan_switches_only_when_the_round_saves_more_than_the_switch_costs(lengths, current, switch_s):
    """The running TP pays nothing, every other TP pays `switch_s`: the plan leaves `current` only for
    a TP whose predicted makespan beats current's by more than the switch."""
    args = (MODELS["qwen2.5-7b"], H100, 64, 0.85, lengths, 500, 34816)
    free = dict(plan_tp(*args).options)
    choice = plan_tp(*args, current=current, switch_s=switch_s)
    assert dict(choice.options) == {tp: m + (0.0 if tp == current else switch_s) for tp, m in free.items()}
    if choice.tp != current:
        assert free[choice.tp] + switch_s <= free[current]
    else:
        assert all(free[current] <= m + switch_s for m in free.values())


def test_a_switch_that_costs_more_than_the_round_saves_is_not_made():
    """A long 32k round on Qwen2.5-7B runs best at TP4 (the test above); from TP1 a switch that costs
    more than the whole gain keeps TP1, and without a cost the plan moves."""
    long = np.full(64, 32000.0)
    free = dict(plan_tp(MODELS["qwen2.5-7b"], H100, 64, 0.85, long, 500, 34816).options)
    gain = free[1] - free[4]
    assert gain > 0
    assert plan_tp(MODELS["qwen2.5-7b"], H100, 64, 0.85, long, 500, 34816, current=1, switch_s=gain * 1.01).tp == 1
    assert plan_tp(MODELS["qwen2.5-7b"], H100, 64, 0.85, long, 500, 34816, current=1, switch_s=gain * 0.5).tp == 4


def test_the_schedulers_plan_rule_counts_the_switch_from_the_running_tp():
    """The Scheduler asks its rule with the TP it runs: a switch dearer than any round keeps the
    starting TP (when it is feasible), a free one moves off it."""
    def first_tp(switch_s: float) -> int:
        rule = TpRule(mode="plan", tp=1, model=MODELS["qwen2.5-7b"], hardware=H100, gpus=64, mem_fraction=0.85,
                      max_context=34816, prompt_tokens=(500,) * 64, unseen_length=32000.0, switch_s=switch_s)
        sched = Scheduler(make_policy("sync", prompts=8, samples=8, max_tokens=32768), num_prompts=64, tp=rule)
        first = sched.begin_round()
        return first[0].tp if isinstance(first[0], SetTensorParallel) else sched.tp
    assert first_tp(0.0) == 4
    assert first_tp(1e9) == 1


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "10"])
def test_a_bad_switch_cost_is_refused_naming_it(bad):
    with pytest.raises(ConfigError, match="switch_s"):
        TpRule(mode="plan", tp=1, model=MODELS["qwen2.5-7b"], hardware=H100, gpus=64, mem_fraction=0.85,
               max_context=34816, prompt_tokens=(500,), unseen_length=100.0, switch_s=bad)
    if isinstance(bad, float):
        with pytest.raises(ConfigError, match="switch_s"):
            plan_tp(MODELS["qwen2.5-7b"], H100, 64, 0.85, [100], 500, 34816, switch_s=bad)
