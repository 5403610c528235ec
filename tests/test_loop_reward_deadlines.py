"""Real runs score with the core's adaptive deadlines: StepLoop hands each reward job to real worker
processes with the timeout the core's Scheduler gives that sample (RollPacker's T = min(max(t_min,
1.5 x slowest correct), t_max)), and the core expires a scoring by its own deadline
(`StartScoring.deadline`), as in the simulator.  So once a fast correct answer is seen, a scorer
slower than the adaptive deadline (though well within the fixed upper bound and the job's own
deadline) is a recorded timeout with reward 0, its worker killed, while the fast ones are scored."""

from __future__ import annotations

import time

import attrs
import pytest

from rollpacker.backends.rewards.pool import ProcessRewardExecutor
from rollpacker.core import BatcherConfig, RewardConfig, Scheduler, make_policy
from rollpacker.core.errors import ConfigError
from rollpacker.core.protocols import RewardJob, RewardOutcome
from rollpacker.driver import StartGrace, StepLoop, VirtualClock
from rollpacker.train.config import RunConfig
from test_step_loop import GOOD, Prompts, RecordingTrainer, ScriptedEngine, ScriptedRewards

SLOW = 2
"""Request k=2's scorer sleeps SLOW_S: past the adaptive deadline, within the upper bound."""
SLOW_S = 30.0  # far past the 0.5 s deadline: on a loaded machine "cut" and "waited for" stay far apart
JOB_DEADLINE_S = 3600.0
"""The reward jobs' own deadline: a backend that dropped the core's would wait the slow scorer out."""
T_MAX = 60.0
DEFAULT_S = min(attrs.fields(RewardJob).deadline_s.default, JOB_DEADLINE_S, T_MAX)
"""The nearest deadline that is not the core's (the jobs' default, their own, t_max): 20x the core's."""


def sleepy_scorer(task, entry, response):
    """Reward 1 for a GOOD response; response (token, k, k) of request k == SLOW takes SLOW_S."""
    if response[1] == SLOW:
        time.sleep(SLOW_S)
    return float(response[0] == GOOD)


class OwnDeadlinePrompts(Prompts):
    def reward_job(self, request_id, index, response_ids) -> RewardJob:
        return attrs.evolve(super().reward_job(request_id, index, response_ids), deadline_s=JOB_DEADLINE_S)


def warm_up(rewards: ProcessRewardExecutor) -> None:
    """One fast job through the pool, so the step's clock does not count the processes' start."""
    rewards.submit(RewardJob("warm-up", "scripted", 0, (GOOD, 0, 0)))
    end = time.monotonic() + 100
    while not rewards.poll(timeout=0.5):
        assert time.monotonic() < end, "the reward pool did not answer a fast job in 100 s"
    rewards.step_report()  # (counts restart)


def timed_out_by(rewards: ProcessRewardExecutor, limit_s: float) -> int:
    """Executor timeouts (killed workers) counted until one is seen or `limit_s` passed."""
    end, timed_out = time.monotonic() + limit_s, 0
    while not timed_out and time.monotonic() < end:
        timed_out += rewards.step_report().num_timed_out
        time.sleep(0.05)
    return timed_out


@pytest.mark.timeout(120)
def test_a_scorer_past_the_adaptive_deadline_is_a_timeout_with_reward_0():
    calls: list = []
    engine = ScriptedEngine(calls)  # request k answers (GOOD if k is even else BAD, k, k)
    # one worker in the core, so request 0 (GOOD, fast) is scored first and anchors T at t_min = 0.5 s
    # (the pool has a second process: the request after the slow one needs no replacement worker)
    sched = Scheduler(make_policy("sync", prompts=2, samples=2, max_tokens=8), num_prompts=4,
                      batcher=BatcherConfig(token_budget=1), rewards=RewardConfig(workers=1, t_min=0.5, t_max=T_MAX))
    assert sched.reward_timeout == T_MAX, "before a correct answer the deadline is the upper bound"
    with ProcessRewardExecutor(2, scorer=sleepy_scorer) as rewards:
        warm_up(rewards)
        loop = StepLoop(sched, engine, rewards, RecordingTrainer(calls, engine), OwnDeadlinePrompts())
        start = time.monotonic()
        record = loop.run_step()
        elapsed = time.monotonic() - start
        killed = timed_out_by(rewards, SLOW_S / 2)
    by_k = {int(i.token_ids[1]): i.reward for i in loop.last_timeline}
    assert by_k == {0: 1.0, 1: 0.0, 2: 0.0, 3: 0.0}, "request 2 (GOOD but slow) timed out: reward 0"
    # the pool kills request 2's scorer at the core's timeout counted from the pool's start of it and
    # answers "timeout"; the core's own expiry waits the pool's start grace, so it never comes first
    assert (sched.reward_state.failures, sched.reward_state.timeouts) == (1, 0)
    assert record["reward_failures"] == 1
    assert killed == 1, "the executor killed the slow scorer at the core's timeout, not the job's own deadline"
    # one worker: request 3 waited in the core's queue behind request 2 until its 0.5 s deadline
    assert 0.4 <= record["reward_wait_s_max"] < DEFAULT_S and record["reward_wait_s_mean"] > 0
    assert sched.reward_timeout == 0.5, "the fast correct answer set T to its floor"
    assert elapsed < SLOW_S / 2, "the slow scorer was cut at its deadline, not waited for"


HANG = 1
"""Request k=1's scorer hangs."""
WORKER_START_S = 3.0
"""Each reward worker's warm-up: a replacement worker is ready this long after the kill, 3x the deadline."""


def hanging_scorer(task, entry, response):
    """Reward 1 for a GOOD response; request HANG's scorer never answers."""
    if response[1] == HANG:
        time.sleep(3600)
    return float(response[0] == GOOD)


def slow_warm_up() -> None:
    time.sleep(WORKER_START_S)


@pytest.mark.timeout(120)
def test_a_scoring_that_waits_for_a_replacement_worker_is_scored_not_cut():
    """One worker: request 1's scorer hangs and is killed at its 1 s deadline; the core then starts
    request 2's scoring, which waits WORKER_START_S for the replacement process.  Its deadline counts
    from the pool's start of it: request 2 (GOOD) is scored 1, not cut for the wait (before the
    pool's start grace, the core's clock cut it: a correct answer scored 0 because another sample
    hung)."""
    calls: list = []
    engine = ScriptedEngine(calls)  # request k answers (GOOD if k is even else BAD, k, k)
    sched = Scheduler(make_policy("sync", prompts=2, samples=2, max_tokens=8), num_prompts=4,
                      batcher=BatcherConfig(token_budget=1), rewards=RewardConfig(workers=1, t_min=1.0, t_max=1.0))
    with ProcessRewardExecutor(1, scorer=hanging_scorer, warmup=slow_warm_up) as rewards:
        warm_up(rewards)
        assert rewards.start_grace_s >= 3 * WORKER_START_S, "3x the slowest worker start seen"
        loop = StepLoop(sched, engine, rewards, RecordingTrainer(calls, engine), Prompts())
        record = loop.run_step()
        report = rewards.step_report()
    by_k = {int(i.token_ids[1]): i.reward for i in loop.last_timeline}
    assert by_k == {0: 1.0, 1: 0.0, 2: 1.0, 3: 0.0}, "only the hanging request 1 failed; request 2 scored 1"
    assert record["reward_failures"] == 1 and report.num_timed_out == 1 and report.num_scored == 3
    assert report.queue_s_max >= WORKER_START_S / 2, "the case under test: a scoring waited for the new worker"


class LateRewards(ScriptedRewards):
    """The scripted scorer on a clock, but request 0's (a GOOD response) answers reward 1 only
    LATE_S clock seconds after it was submitted: past the core's deadline, while the step still runs."""

    LATE_S = 3.5

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self.clock, self.late, self.late_answered_at = clock, [], None

    def submit(self, job: RewardJob) -> None:
        if job.response[1] == 0:
            self.late.append((self.clock.now() + self.LATE_S, job.request_id))
        else:
            super().submit(job)

    def poll(self, timeout=None):
        due = [rid for at, rid in self.late if at <= self.clock.now()]
        if due:
            self.late, self.late_answered_at = [], self.clock.now()
        return super().poll(timeout) + [RewardOutcome(rid, 1.0, "ok") for rid in due]


def test_a_late_answer_on_the_live_path_is_expired_by_the_cores_deadline_as_in_the_simulator():
    """One expiry path: the live backend tells the core when a `StartScoring.deadline` passed (the
    engine ticks one clock second a poll), the core times the scoring out with reward 0, and the
    scorer's answer that comes after it changes nothing: not the trained reward, not the record."""
    from test_driver import TickingEngine  # (here: the scorer processes above need not import it)

    calls: list = []
    clock = VirtualClock()
    engine = TickingEngine(calls, clock)  # request k answers at second k + 1: (GOOD if k is even, k, k)
    sched = Scheduler(make_policy("sync", prompts=2, samples=4, max_tokens=8), num_prompts=4,
                      batcher=BatcherConfig(token_budget=1), rewards=RewardConfig(workers=8, t_min=2.0, t_max=2.0))
    rewards = LateRewards(clock)
    loop = StepLoop(sched, engine, rewards, RecordingTrainer(calls, engine), Prompts(), clock=clock)
    record = loop.run_step()
    assert rewards.late_answered_at is not None and rewards.late_answered_at < clock.now(), \
        "the case under test: the late answer came while the step ran"
    assert (sched.reward_state.timeouts, sched.reward_state.failures) == (1, 0), "timed out by the core's deadline"
    assert sched.reward_state.grace == 0.0, "an executor that starts each job on submission tells no grace"
    by_k = {int(i.token_ids[1]): i.reward for i in loop.last_timeline}
    assert by_k == {0: 0.0, 1: 0.0, 2: 1.0, 3: 0.0, 4: 1.0, 5: 0.0, 6: 1.0, 7: 0.0}
    assert record["reward_failures"] == 1 and record["mean_reward"] == 3 / 8


def test_reward_deadline_flag_bounds_the_adaptive_deadline():
    config = RunConfig(reward_deadline_s=6.0, reward_workers=3).reward_config()
    assert (config.workers, config.timeout(None), config.timeout(0.1), config.timeout(3.0), config.timeout(9.0)) == \
        (3, 6.0, 2.0, 4.5, 6.0)
    fixed = RunConfig(reward_deadline_s=1.0).reward_config()
    assert fixed.timeout(None) == fixed.timeout(0.01) == fixed.timeout(5.0) == 1.0


def test_reward_hedge_flags_set_the_cores_hedge_and_0_turns_it_off():
    assert RunConfig(reward_hedge_after_s=3.0).reward_config().hedge_after == 3.0
    assert RunConfig(reward_hedge_after_s=0).reward_config().hedge_after is None
    assert RunConfig(reward_hedge_copies=3).reward_config().hedge_copies == 3
    with pytest.raises(ConfigError, match="--reward-hedge-copies must be >= 1"):
        RunConfig(reward_hedge_copies=0).rewards_options()


def test_the_simulator_and_the_reference_trainer_share_one_reward_setting():
    """Hedging (when, how many copies), priority and burst workers: the simulator's defaults are the live
    path's (the core's RewardConfig defaults); only the worker count is each setting's own."""
    from rollpacker.sim.constants import RewardConstants

    same = ("hedge_after", "hedge_copies", "priority", "burst_workers")
    live, sim = RunConfig().reward_config(), RewardConstants().scheduler_config()
    assert {k: getattr(live, k) for k in same} == {k: getattr(sim, k) for k in same}


def slower_warm_up() -> None:
    time.sleep(4.0)  # 3 x 4 s: past the pool's 10 s floor of start grace


@pytest.mark.timeout(120)
def test_the_core_follows_the_pool_s_start_grace_as_it_grows():
    """The loop is built before the pool has started a worker (as the reference trainer builds it): the
    grace the core waits past a deadline must follow what the pool measures afterwards, not stay at
    the floor it had when the loop was built.  The live backend's wait tells the core each new value
    (`StartGrace`), and the core's next expiry moves with it."""
    from rollpacker.backends.rewards.pool import MIN_START_GRACE_S

    calls: list = []
    engine = ScriptedEngine(calls)
    sched = Scheduler(make_policy("sync", prompts=2, samples=2, max_tokens=8), num_prompts=4,
                      batcher=BatcherConfig(token_budget=1), rewards=RewardConfig(workers=1, t_min=1.0, t_max=1.0))
    with ProcessRewardExecutor(1, scorer=hanging_scorer, warmup=slower_warm_up) as rewards:
        loop = StepLoop(sched, engine, rewards, RecordingTrainer(calls, engine), Prompts())

        def one_wait() -> list:
            inputs = loop.live.wait()
            for item in inputs:
                loop.feed(item)
            return inputs

        assert one_wait() == [StartGrace(MIN_START_GRACE_S)]  # no worker start measured yet
        assert sched.reward_state.grace == MIN_START_GRACE_S and one_wait() == []  # told once
        warm_up(rewards)
        assert rewards.start_grace_s >= 12.0
        assert one_wait() == [StartGrace(rewards.start_grace_s)]
        assert sched.reward_state.grace == rewards.start_grace_s
        (start,) = sched.start_scoring("rp000000000000", at=100.0)
        assert (start.deadline, sched.next_reward_expiry) == (101.0, 101.0 + rewards.start_grace_s)
