"""Prompt pool, stream batcher, advantages and metrics in isolation."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollpacker.core import (
    BatcherConfig,
    CloseGroup,
    EndRound,
    PromptKey,
    PromptPool,
    RewardScored,
    Sample,
    ScoreSample,
    Segment,
    StepOptimizer,
    StreamBatcher,
    TrainMicroBatch,
    advantages,
    bubble_ratio,
)
from rollpacker.core.records import request_id
from rollpacker.core.commands import RoundReport
from rollpacker.core.prompt_pool import COMPLETED, DEFERRED, FRESH, IN_FLIGHT


def test_core_imports_no_torch_nor_backends():
    code = (
        "import sys, rollpacker.core; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'asyncio', 'sglang', "
        "'torchtitan') or m.startswith(('rollpacker.backends', 'rollpacker.sim'))]; print(bad); assert not bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_driver_imports_no_backend():
    """The driver runs the core against the Protocols: its errors (TrainerFailed) come from the core."""
    code = "import sys, rollpacker.driver; bad = [m for m in sys.modules if m.startswith('rollpacker.backends')]; " \
           "print(bad); assert not bad"
    subprocess.run([sys.executable, "-c", code], check=True)


# -- prompt pool -----------------------------------------------------------------------------------

pool_ops = st.lists(st.tuples(st.sampled_from(["take", "defer", "release", "complete", "take_deferred", "record"]),
                              st.integers(1, 7)), max_size=40)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 30), seed=st.integers(0, 99), ops=pool_ops)
def test_pool_states_partition_and_round_trip(n, seed, ops):
    pool = PromptPool(num_prompts=n, seed=seed)
    drawn: list[PromptKey] = []
    completed: set = set()
    rng = np.random.default_rng(seed)
    for op, k in ops:
        inflight = sorted(pool.in_flight)
        if op == "take":
            pool, keys = pool.take(k)
            assert len(keys) == k and not set(keys) & set(drawn) - set(pool.returned) - set(keys)
            drawn += [key for key in keys if key not in drawn]
        elif op == "take_deferred":
            pool, _ = pool.take_deferred(k)
        elif op == "record" and inflight:
            pool = pool.record_lengths([x.index for x in inflight[:k]], rng.integers(1, 900, len(inflight[:k])),
                                       [True] * len(inflight[:k]))
        elif inflight:
            chosen = inflight[:k]
            pool = getattr(pool, op)(chosen)
            if op == "complete":
                completed |= set(chosen)
        restored = PromptPool.from_dict(pool.to_dict())
        assert restored.same_as(pool)
        for key in drawn:  # each key in exactly one state
            assert (pool.status(key) == COMPLETED) == (key in completed)
            expected = {IN_FLIGHT: key in pool.in_flight, DEFERRED: key in pool.deferred}
            assert sum(expected.values()) <= 1
    after = pool.recover()
    assert not after.in_flight and set(pool.in_flight) <= set(after.returned)


def test_pool_epoch_order_is_seeded_and_covers_every_prompt():
    pool, keys = PromptPool(num_prompts=10, seed=4).take(25)
    epochs = [[k.index for k in keys if k.epoch == e] for e in (0, 1)]
    assert sorted(epochs[0]) == list(range(10)) and sorted(epochs[1]) == list(range(10))
    assert epochs[0] != epochs[1]
    assert PromptPool(num_prompts=10, seed=4).take(25)[1] == keys
    assert pool.status(PromptKey(2, 0)) in (FRESH, IN_FLIGHT)


def test_length_prediction_learns_a_prompt_and_floors_at_cut_length():
    pool = PromptPool(num_prompts=3)
    pool = pool.record_lengths([0, 0, 0, 1, 1], [100, 120, 90, 4000, 3500], [True] * 5)
    short, long = pool.predict(0), pool.predict(1)
    assert short.median < 200 < 2000 < long.median and short.count == 3
    cut = pool.record_lengths([2], [5000], [False]).predict(2)
    assert cut.censored == 1 and cut.quantile(0.0) >= 5000


def test_pool_refuses_illegal_moves_naming_the_key():
    pool = PromptPool(num_prompts=5)
    with pytest.raises(ValueError, match="e0/p"):
        pool.complete([PromptKey(0, 1)])
    with pytest.raises(ValueError, match="num_prompts"):
        PromptPool(num_prompts=0)
    with pytest.raises(ValueError, match="missing field"):
        PromptPool.from_dict({"num_prompts": 3})


# -- stream batcher --------------------------------------------------------------------------------

def _report(step):
    return RoundReport(step, "normal", 0, 0, 0, 0, 0, 0, (), 0, 0, 0, 0.0, 0.0)


groups_strategy = st.lists(st.lists(st.tuples(st.integers(1, 300), st.floats(-1, 1)), min_size=1, max_size=5),
                           min_size=1, max_size=8)


@settings(max_examples=80, deadline=None)
@given(groups=groups_strategy, budget=st.integers(1, 800), agg=st.sampled_from(["token-mean", "seq-mean-token-mean"]),
       adv=st.sampled_from(["grpo", "grpo-mean", "rloo"]), dynamic=st.booleans(), order=st.randoms())
def test_batcher_partitions_samples_and_normalises_to_the_full_batch(groups, budget, agg, adv, dynamic, order):
    batcher = StreamBatcher(BatcherConfig(token_budget=budget, loss_aggregation=agg, advantage=adv,
                                          dynamic_sampling=dynamic))
    state = batcher.initial(step=3)
    number, items, trained, all_samples = 0, [], [], {}
    for g, members in enumerate(groups):
        samples = []
        for i, (length, reward) in enumerate(members):
            rid = request_id(number)
            number += 1
            sample = Sample(rid, PromptKey(0, g), i, (Segment(rid, length, 3),), "stop")
            samples.append(sample)
            all_samples[rid] = (sample, reward)
            items.append(("score", ScoreSample(sample)))
            items.append(("reward", RewardScored(rid, reward)))
        items.append(("group", CloseGroup(PromptKey(0, g), tuple(samples))))
        trained.append(PromptKey(0, g))
    # any order where a sample is kept before its reward and before its group completes
    scores = [x for x in items if x[0] == "score"]
    rest = [x for x in items if x[0] != "score"]
    order.shuffle(rest)
    out = []
    for _, item in scores + rest + [("end", EndRound(3, "normal", tuple(trained), _report(3)))]:
        state, commands = batcher.handle(state, item)
        out += commands
    micro = [c for c in out if isinstance(c, TrainMicroBatch)]
    steps = [c for c in out if isinstance(c, StepOptimizer)]
    assert len(steps) == 1 and out[-1] is steps[0]
    step = steps[0]
    rids = [r.sample.request_id for mb in micro for r in mb.samples]
    assert len(rids) == len(set(rids)), "a sample trained twice"
    dropped = set(step.dropped_groups)
    expected = {rid for rid, (s, _) in all_samples.items() if s.prompt not in dropped}
    assert set(rids) == expected, "micro-batches do not partition the kept samples"
    for mb in micro:
        assert mb.num_tokens <= budget or len(mb.samples) == 1
    weighted = sum(r.token_weight * r.sample.num_tokens for mb in micro for r in mb.samples)
    assert math.isclose(weighted, step.loss_normalizer, rel_tol=1e-9, abs_tol=1e-9)
    if dynamic:
        for prompt in dropped:
            rewards = [r for s, r in all_samples.values() if s.prompt == prompt]
            assert max(rewards) == min(rewards)
    by_group: dict = {}  # every estimator's advantages sum to zero within a group
    for mb in micro:
        for r in mb.samples:
            by_group.setdefault(r.sample.prompt, []).append(r.advantage)
    for advs in by_group.values():
        assert abs(sum(advs)) < 1e-6 * max(1, len(advs))
    scored: dict = {}  # a better reward gets a larger advantage: the gradient's sign
    for r in (r for mb in micro for r in mb.samples):
        scored.setdefault(r.sample.prompt, []).append((all_samples[r.sample.request_id][1], r.advantage))
    for pairs in scored.values():
        for (r1, a1), (r2, a2) in ((x, y) for x in pairs for y in pairs):
            assert a1 >= a2 if r1 >= r2 else True
            assert a1 > a2 if r1 > r2 + 1e-3 else True


@pytest.mark.parametrize("kind,expected", [
    ("grpo", [1.0, -1.0, -1.0, 1.0]),  # (r - mean) / population std, mean 0.5, std 0.5
    ("grpo-mean", [0.5, -0.5, -0.5, 0.5]),  # r - mean (Dr. GRPO)
    ("rloo", [2 / 3, -2 / 3, -2 / 3, 2 / 3]),  # r_i - mean of the other three
])
def test_advantages_match_hand_computed_values(kind, expected):
    """Rewarded responses get positive advantages: a flipped sign would train away from them."""
    got = advantages([1.0, 0.0, 0.0, 1.0], kind, eps=0.0)
    assert got == pytest.approx(expected)


@settings(max_examples=60, deadline=None)
@given(rewards=st.lists(st.floats(-10, 10), min_size=2, max_size=16), kind=st.sampled_from(["grpo", "grpo-mean", "rloo"]))
def test_advantages_keep_the_order_and_sign_of_rewards(rewards, kind):
    r = np.array(rewards)
    adv = np.array(advantages(rewards, kind, eps=1e-6))
    above = r - r.mean() > 1e-6 * (1 + abs(r.mean()))
    below = r - r.mean() < -1e-6 * (1 + abs(r.mean()))
    assert (adv[above] > 0).all() and (adv[below] < 0).all()
    order = np.argsort(r, kind="stable")
    assert (np.diff(adv[order]) >= -1e-9).all()


def test_batcher_refuses_bad_rewards():
    batcher = StreamBatcher()
    state = batcher.initial()
    with pytest.raises(ValueError, match="never kept"):
        batcher.handle(state, RewardScored(request_id(7), 1.0))
    with pytest.raises(ValueError, match="finite"):
        RewardScored(request_id(7), float("nan"))
    with pytest.raises(ValueError, match="finite"):
        RewardScored(request_id(7), float("inf"))


def test_batcher_drops_a_discarded_samples_reward_that_comes_steps_later():
    # A kept sample whose group is not trained (SortedRL on-policy drops it at the update) may still be
    # queued or running at its scorer after the next step ends too (hedged, long deadlines): its reward
    # is dropped whenever it comes, not refused as "never kept".
    batcher = StreamBatcher()
    late = Sample(request_id(0), PromptKey(0, 0), 0, (Segment(request_id(0), 5, 0),), "stop")
    state, _ = batcher.handle(batcher.initial(0), ScoreSample(late))
    for step in (0, 1):
        state, out = batcher.handle(state, EndRound(step, "normal", (), _report(step)))
        assert isinstance(out[-1], StepOptimizer)
    state, out = batcher.handle(state, RewardScored(request_id(0), 1.0))
    assert out == [] and late.number not in state.status and not state.rewards


def test_bubble_ratio_matches_the_sortedrl_formula():
    # capacity 4: 4 running for 1 s, then 1 running for 3 s -> idle 9 of 16 slot-seconds
    assert bubble_ratio([0.0, 1.0], [4, 1], capacity=4, end=4.0) == pytest.approx(9 / 16)
    assert bubble_ratio([0.0], [8], capacity=4, end=2.0) == 0.0


def test_the_public_api_lists_components_not_planner_internals():
    import rollpacker.core as core

    for name in ("Scheduler", "PromptPool", "StreamBatcher", "RewardScheduler", "TpRule", "make_policy", "Policy"):
        assert name in core.__all__ and hasattr(core, name)
    for name in ("RoundPlanner", "PlannerState", "request_id", "request_number", "plan_tp", "OnlineTP", "TpChoice"):
        assert name not in core.__all__ and not hasattr(core, name)
    assert sorted(core.__all__) == sorted(set(core.__all__))
    assert all(hasattr(core, name) for name in core.__all__)


@settings(max_examples=100, deadline=None)
@given(steps=st.lists(st.tuples(st.floats(0.0, 5.0), st.sampled_from([+1, -1])), max_size=60))
def test_occupancy_log_counts_running_requests_and_refuses_time_going_back(steps):
    from rollpacker.core.metrics import Occupancy

    log, at, running, seen = Occupancy(), 0.0, 0, set()
    for gap, delta in steps:
        at, running = at + gap, running + delta
        log.change(at, delta)
        seen.add(at)
        assert log.times[-1] == at and log.running[-1] == running
    assert log.times == sorted(seen) and len(log.running) == len(seen)  # changes at one time: one entry
    assert log.bubble_ratio(8, at + 1.0) == bubble_ratio(log.times, log.running, 8, at + 1.0)
    if steps:
        with pytest.raises(ValueError, match="time went backwards"):
            log.change(at - 1.0, +1)
