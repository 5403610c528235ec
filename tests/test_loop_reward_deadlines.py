"""Real runs score with the core's adaptive deadlines: StepLoop hands each reward job to real worker
processes with the deadline the core's Scheduler gives that sample (RollPacker's T = min(max(t_min,
1.5 x slowest correct), t_max)), so once a fast correct answer is seen, a scorer slower than the
adaptive deadline (though well within the fixed upper bound) is killed: a recorded timeout with
reward 0, while the fast ones are scored."""

from __future__ import annotations

import time

import pytest

from rollpacker.backends.rewards.pool import ProcessRewardExecutor
from rollpacker.core import BatcherConfig, RewardConfig, Scheduler, make_policy
from rollpacker.driver import StepLoop
from rollpacker.train.config import RunConfig
from test_step_loop import GOOD, Prompts, RecordingTrainer, ScriptedEngine

SLOW = 2
"""Request k=2's scorer sleeps SLOW_S: past the adaptive deadline, within the upper bound."""
SLOW_S = 30.0  # far past the 0.5 s deadline: on a loaded machine "cut" and "waited for" stay far apart


def sleepy_scorer(task, entry, response):
    """Reward 1 for a GOOD response; response (token, k, k) of request k == SLOW takes SLOW_S."""
    if response[1] == SLOW:
        time.sleep(SLOW_S)
    return float(response[0] == GOOD)


@pytest.mark.timeout(120)
def test_a_scorer_past_the_adaptive_deadline_is_a_timeout_with_reward_0():
    calls: list = []
    engine = ScriptedEngine(calls)  # request k answers (GOOD if k is even else BAD, k, k)
    # one worker, so request 0 (GOOD, fast) is scored first and anchors T at t_min = 0.5 s
    sched = Scheduler(make_policy("sync", prompts=2, samples=2, max_tokens=8), num_prompts=4,
                      batcher=BatcherConfig(token_budget=1), rewards=RewardConfig(workers=1, t_min=0.5, t_max=60.0))
    assert sched.reward_timeout == 60.0, "before a correct answer the deadline is the upper bound"
    with ProcessRewardExecutor(1, scorer=sleepy_scorer) as rewards:
        loop = StepLoop(sched, engine, rewards, RecordingTrainer(calls, engine), Prompts())
        start = time.monotonic()
        record = loop.run_step()
        elapsed = time.monotonic() - start
        report = rewards.step_report()
    by_k = {int(i.token_ids[1]): i.reward for i in loop.last_timeline}
    assert by_k == {0: 1.0, 1: 0.0, 2: 0.0, 3: 0.0}, "request 2 (GOOD but slow) timed out: reward 0"
    assert report.num_timed_out == 1 and report.num_scored == 3
    assert record["reward_failures"] == 1
    # one worker: request 3 waited in the core's queue behind request 2 until its 0.5 s deadline
    assert 0.4 <= record["reward_wait_s_max"] < SLOW_S and record["reward_wait_s_mean"] > 0
    assert sched.reward_timeout == 0.5, "the fast correct answer set T to its floor"
    assert elapsed < SLOW_S / 2, "the slow scorer was cut at its deadline, not waited for"


def test_reward_deadline_flag_bounds_the_adaptive_deadline():
    config = RunConfig(reward_deadline_s=6.0, reward_workers=3).reward_config()
    assert (config.workers, config.timeout(None), config.timeout(0.1), config.timeout(3.0), config.timeout(9.0)) == \
        (3, 6.0, 2.0, 4.5, 6.0)
    fixed = RunConfig(reward_deadline_s=1.0).reward_config()
    assert fixed.timeout(None) == fixed.timeout(0.01) == fixed.timeout(5.0) == 1.0


def test_reward_hedge_flag_sets_the_cores_hedge_and_0_turns_it_off():
    assert RunConfig(reward_hedge_after_s=3.0).reward_config().hedge_after == 3.0
    assert RunConfig(reward_hedge_after_s=0).reward_config().hedge_after is None
