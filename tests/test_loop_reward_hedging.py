"""Real runs hedge a hung scorer: StepLoop with real reward worker processes, where the first
execution of one sample's scorer hangs (a stuck sandbox: it sleeps far past anything the step may
wait) and a re-run of it answers at once.  With `hedge_after` the core starts a second copy on a
free worker; its answer is the sample's reward (correct, not a timeout), the hung copy is cancelled
(its worker killed), and the step does not wait for the deadline.  The process pool itself: a
cancelled job gives no outcome, and copies that all fail give one outcome."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from rollpacker.backends.rewards.pool import ProcessRewardExecutor
from rollpacker.core import BatcherConfig, RewardConfig, Scheduler, make_policy
from rollpacker.core.protocols import RewardJob
from rollpacker.driver import StepLoop
from test_step_loop import GOOD, Prompts, RecordingTrainer, ScriptedEngine

STUCK = 2
"""Request k=2 (a GOOD response): its scorer's first execution hangs."""
HANG_S = 90.0
DEADLINE_S = 60.0
"""The upper bound of the deadline: without a hedge the step waits this long for request 2."""


def stuck_once_scorer(task, entry, response):
    """Reward 1 for a GOOD response.  Request STUCK's first execution (no mark yet in
    $RP_TEST_MARKS) leaves its mark and hangs; every later execution answers at once."""
    if response[1] == STUCK:
        mark = Path(os.environ["RP_TEST_MARKS"]) / str(response[1])
        if not mark.exists():
            mark.touch()
            time.sleep(HANG_S)
    return float(response[0] == GOOD)


SLOW_S = 1.5


def slow_scorer(task, entry, response):
    """Reward 1 for a GOOD response, after SLOW_S: every execution outlives hedge_after."""
    time.sleep(SLOW_S)
    return float(response[0] == GOOD)


class AnswersTogether(ProcessRewardExecutor):
    """The real pool, whose poll hands over its answers only once every job in flight has answered,
    as a driver that runs late (a loaded machine) finds them: each answer comes in the poll that
    also brings the engine's next finished request."""

    def poll(self, timeout=None):
        held = []
        while self.num_in_flight:
            held += super().poll(timeout=None)
        return held + super().poll(timeout=0)


def run(hedge_after: float | None, scorer=stuck_once_scorer,
        executor=ProcessRewardExecutor) -> tuple[dict, dict, float, object]:
    calls: list = []
    engine = ScriptedEngine(calls)  # request k answers (GOOD if k is even else BAD, k, k)
    config = RewardConfig(workers=4, t_min=DEADLINE_S, t_max=DEADLINE_S, hedge_after=hedge_after)
    sched = Scheduler(make_policy("sync", prompts=2, samples=2, max_tokens=8), num_prompts=4,
                      batcher=BatcherConfig(token_budget=1), rewards=config)
    with executor(4, scorer=scorer) as rewards:
        loop = StepLoop(sched, engine, rewards, RecordingTrainer(calls, engine), Prompts())
        start = time.monotonic()
        record = loop.run_step()
        elapsed = time.monotonic() - start
        assert rewards.poll(timeout=None) == [], "the hung copy gives no outcome (cancelled)"
        report = rewards.step_report()
    by_k = {int(i.token_ids[1]): i.reward for i in loop.last_timeline}
    return by_k, record, elapsed, report


@pytest.mark.timeout(120)
def test_a_hung_scorer_is_hedged_on_a_free_worker_not_waited_out(tmp_path, monkeypatch):
    monkeypatch.setenv("RP_TEST_MARKS", str(tmp_path))
    by_k, record, elapsed, report = run(hedge_after=1.0)
    assert by_k == {0: 1.0, 1: 0.0, 2: 1.0, 3: 0.0}, "request 2 scored by its hedge: correct, not a timeout"
    assert record["reward_failures"] == 0 and report.num_timed_out == 0 and report.num_scored == 4
    # the hung copy was cancelled: its worker killed and replaced (on a loaded machine a slow, not hung,
    # scoring may pass hedge_after too, and its cancelled copy's worker is replaced as well: 2 in one CI run)
    assert report.num_workers_replaced >= 1, "the hung copy was cancelled: its worker killed and replaced"
    assert elapsed < DEADLINE_S / 2, "the step did not wait for the hung execution's deadline"


@pytest.mark.timeout(120)
def test_an_answer_in_hand_is_not_hedged_while_the_core_is_fed_what_came_before_it():
    """Each scoring outlives hedge_after (SLOW_S) while the poll holds it; its answer then comes in the
    same poll as the engine's next finished request, which the core is fed first: it starts that
    sample's scoring and, a worker being free, hedges the one it has not yet been told answered.  That
    copy is not sent (its answer is in hand): every sample keeps its own reward, no copy is cancelled."""
    by_k, record, _, report = run(hedge_after=1.0, scorer=slow_scorer, executor=AnswersTogether)
    assert by_k == {0: 1.0, 1: 0.0, 2: 1.0, 3: 0.0}
    assert record["reward_failures"] == 0 and report.num_timed_out == 0 and report.num_scored == 4
    assert report.num_workers_replaced == 0, "no hedge ran, so none was cancelled"


def test_a_cancelled_job_gives_no_outcome_and_its_worker_is_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv("RP_TEST_MARKS", str(tmp_path))
    stuck = RewardJob("rp000000000002", "t", None, (GOOD, STUCK, STUCK), deadline_s=DEADLINE_S)
    with ProcessRewardExecutor(2, scorer=stuck_once_scorer) as rewards:
        rewards.submit(stuck)
        while not (tmp_path / str(STUCK)).exists():  # the first copy is running (hung)
            time.sleep(0.05)
        rewards.submit(RewardJob("rp000000000002", "t", None, (GOOD, STUCK, STUCK), deadline_s=DEADLINE_S, copy=1))
        (outcome,) = rewards.poll(timeout=DEADLINE_S / 2)
        assert (outcome.request_id, outcome.copy, outcome.reward, outcome.status) == ("rp000000000002", 1, 1.0, "ok")
        assert rewards.num_in_flight == 1
        rewards.cancel("rp000000000002")
        assert rewards.poll(timeout=None) == [] and rewards.num_in_flight == 0
        report = rewards.step_report()
    assert report.num_workers_replaced == 1 and report.num_timed_out == 0 and report.num_scored == 1


def test_copies_that_all_time_out_give_one_outcome_counted_once():
    """A scorer that hangs on every run: both copies reach the same deadline; the request has one
    "timeout" outcome and the step report counts one."""
    with ProcessRewardExecutor(2, scorer=always_stuck_scorer) as rewards:
        for copy in (0, 1):
            rewards.submit(RewardJob("rp000000000002", "t", None, (GOOD, STUCK, STUCK), deadline_s=1.0, copy=copy))
        outcomes = []
        while rewards.num_in_flight:  # (a poll with no timeout returns once nothing is in flight)
            outcomes += rewards.poll(timeout=None)
        report = rewards.step_report()
    assert [(o.request_id, o.status) for o in outcomes] == [("rp000000000002", "timeout")]
    assert report.num_timed_out == 1 and report.failures_by_kind["timeout"] == 1


def always_stuck_scorer(task, entry, response):
    time.sleep(HANG_S)
    return 1.0
