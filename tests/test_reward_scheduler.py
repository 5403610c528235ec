"""Reward scheduler: worker budget, adaptive timeout, failures are reward 0, never a stuck step."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import heapq
import itertools
import math
from collections import Counter

from rollpacker.core import (
    ConfigError,
    LaunchRequest,
    RequestFinished,
    RewardScored,
    Scheduler,
    ScoreSample,
    make_policy,
)
from rollpacker.core.errors import SchedulerMisuse
from rollpacker.core.records import request_id, request_number
from rollpacker.core.reward_scheduler import RewardConfig, RewardScheduler, StartScoring
from rollpacker.driver import DeadlinePassed, Driver, HedgeDue, ScorerAnswered, VirtualClock


def starts(out):
    return [c for c in out if isinstance(c, StartScoring)]


def test_timeout_formula_paper_defaults():
    c = RewardConfig()
    assert c.timeout(None) == 30.0
    assert c.timeout(0.5) == 2.0
    assert c.timeout(4.0) == 6.0
    assert c.timeout(100.0) == 30.0
    with pytest.raises(ConfigError):
        RewardConfig(t_min=5, t_max=1)


def test_worker_budget_and_anchor():
    sched = RewardScheduler(RewardConfig(workers=2, hedge_after=None))  # (hedging: below)
    s = sched.initial()
    s, out = sched.submit(s, request_id(1), 0.0)
    s, out2 = sched.submit(s, request_id(2), 0.0)
    s, out3 = sched.submit(s, request_id(3), 0.0)
    assert len(starts(out + out2)) == 2 and not starts(out3) and s.num_waiting == 1
    assert (starts(out)[0].deadline, starts(out)[0].at, starts(out)[0].time_limit) == (30.0, 0.0, 30.0)
    s, out = sched.finished(s, request_id(1), 1.0, True, 4.0)  # correct after 4 s: anchor 4
    assert out[0] == RewardScored(request_id(1), 1.0, False, 4.0)
    (start,) = starts(out)
    assert start.request_id == request_id(3) and start.deadline == 10.0 and start.at == 4.0 and start.time_limit == 6.0
    s, out = sched.expire(s, 10.0)  # request 3 times out (request 2's deadline is 30)
    assert out == [RewardScored(request_id(3), 0.0, True, 10.0)]
    s, out = sched.finished(s, request_id(3), 1.0, True, 11.0)  # late answer ignored
    assert out == [] and s.anchor == 4.0 and s.timeouts == 1


def test_failed_scorer_is_reward_zero_and_does_not_move_anchor():
    sched = RewardScheduler()
    s, _ = sched.submit(sched.initial(), request_id(1), 0.0)
    s, out = sched.finished(s, request_id(1), 1.0, True, 9.0, failed=True)
    assert out[0].reward == 0.0 and out[0].failed and s.anchor is None and s.failures == 1


@given(st.lists(st.tuples(st.floats(0, 100), st.booleans(), st.booleans()), min_size=1, max_size=60),
       st.integers(1, 8))
def test_every_submitted_sample_gets_exactly_one_reward(jobs, workers):
    """Whatever the execution times (inf: a hang), each sample is answered once, by its deadline."""
    sched = RewardScheduler(RewardConfig(workers=workers))
    s = sched.initial()
    now, pending, answered = 0.0, {}, []
    def take(out):
        for item in out:
            if isinstance(item, StartScoring):
                seconds, correct, hang = jobs[int(item.request_id[2:])]
                pending[item.request_id] = (item.start if False else now, seconds, correct, hang, item.deadline)
            else:
                answered.append(item)
    for i in range(len(jobs)):
        s, out = sched.submit(s, request_id(i), now)
        take(out)
    while pending:
        events = []
        for rid, (start, seconds, correct, hang, deadline) in pending.items():
            done = start + seconds if not hang else float("inf")
            events.append((min(done, deadline), rid, done <= deadline))
        at, rid, ok = min(events)
        now = at
        start, seconds, correct, hang, deadline = pending.pop(rid)
        if ok:
            s, out = sched.finished(s, rid, float(correct), correct, now)
        else:
            s, out = sched.expire(s, now)
            for item in out:
                if isinstance(item, RewardScored) and item.request_id != rid:
                    pending.pop(item.request_id, None)
        take(out)
        assert len(s.running) <= workers
    assert sorted(a.request_id for a in answered) == sorted(request_id(i) for i in range(len(jobs)))
    assert all(a.reward == 0.0 for a in answered if a.failed)


class TimedScorers:
    """A fake backend of `driver.Driver` on a VirtualClock: each request finishes 1-3 s after its
    launch, each scorer takes the next of `durations` (inf: a hang) and answers reward 1 for an even
    request number; one past its timeout is left to the core's deadline.  It checks every
    StartScoring against the adaptive rule from the correct answers seen before it started, and
    observes (counts) the rewards the core settles."""

    def __init__(self, sched: Scheduler, config: RewardConfig, durations) -> None:
        self.config, self.clock = config, VirtualClock()
        self.driver = Driver(sched, self, self.clock)
        self.heap, self.tick, self.draw = [], itertools.count(), itertools.cycle(durations)
        self.kept, self.answered, self.anchor, self.opt_steps = [], Counter(), None, 0
        self.deadlines: dict[str, float] = {}
        self.first_start: dict[str, float] = {}
        self.hedged: set[str] = set()

    def _push(self, at: float, item) -> None:
        heapq.heappush(self.heap, (at, next(self.tick), item))

    def launch(self, commands) -> None:
        for c in commands:
            done = self.clock.now() + 1.0 + request_number(c.request_id) % 3
            self._push(done, RequestFinished(c.request_id, 4, "stop", done))

    def abort(self, request_ids) -> None:
        """The requests finish anyway: the core takes a finish after its abort."""

    def start_scoring(self, command: StartScoring) -> None:
        now = self.clock.now()
        assert command.at == now
        if command.copy:  # a hedge: the sample's deadline, the time left to it
            assert command.deadline == self.deadlines[command.request_id] and command.time_limit == command.deadline - now
            self.hedged.add(command.request_id)
        else:
            assert command.time_limit == pytest.approx(self.config.timeout(self.anchor))
            assert command.deadline == now + self.driver.sched.reward_timeout  # (the core's T when it started it)
            self.deadlines[command.request_id] = command.deadline
            self.first_start[command.request_id] = now
        if command.hedge_at is not None:
            self._push(command.hedge_at, HedgeDue())
        seconds = next(self.draw)
        if seconds < command.time_limit:
            reward = float(request_number(command.request_id) % 2 == 0)  # even requests are correct
            self._push(now + seconds, ScorerAnswered(command.request_id, reward, seconds=seconds))
        else:
            self._push(command.deadline, DeadlinePassed())

    def train(self, command) -> None: ...

    def step_optimizer(self, command) -> None:
        self.opt_steps += 1

    def wait(self) -> list:
        at, _, item = heapq.heappop(self.heap)
        self.clock.advance_to(at)
        if (isinstance(item, ScorerAnswered) and item.reward > 0 and item.request_id in self.deadlines
                and at < self.deadlines[item.request_id]):
            # the first answer (a later copy's is ignored), before the deadline (one that lands on it, a
            # copy drawn a hair under the time left, comes after the core's DeadlinePassed: late);
            # hedged: the time since the first start
            rid = item.request_id
            seconds = at - self.first_start[rid] if rid in self.hedged else item.seconds
            self.anchor = max(self.anchor or 0.0, seconds)
            del self.deadlines[rid]
        return [item]

    def observe(self, notice) -> None:
        if isinstance(notice, ScoreSample):
            self.kept.append(notice.sample.request_id)
        elif isinstance(notice, RewardScored):
            self.answered[notice.request_id] += 1
            assert not notice.failed or notice.reward == 0.0

    def finish_step(self, ledger, pending) -> dict:
        return {}


@given(st.lists(st.one_of(st.floats(0.0, 40.0), st.just(math.inf)), min_size=1, max_size=12),
       st.integers(1, 3), st.sampled_from(["sync", "tail", "partial"]))
@example([math.inf, 1.3577592512697372, math.inf, math.inf], 2, "tail")  # a hedge's answer lands on the deadline
def test_scheduler_scores_every_kept_sample_once_by_the_cores_deadline(durations, workers, policy):
    """The real driver over scorers with times drawn from `durations` (inf: a hang) finishes each
    step with one optimizer step: every kept sample is answered exactly once, by the deadline the
    core gave it, and each deadline follows the adaptive rule from the correct answers seen before
    it started."""
    config = RewardConfig(workers=workers, t_min=2.0, scale=1.5, t_max=30.0)
    sched = Scheduler(make_policy(policy, prompts=2, samples=2, max_tokens=8), num_prompts=6, rewards=config)
    backend = TimedScorers(sched, config, durations)
    for step in range(2):
        backend.driver.run_step()
        assert sched.step_done and backend.opt_steps == step + 1
    assert set(backend.answered) <= set(backend.kept) and all(n == 1 for n in backend.answered.values())
    assert sched.reward_state.anchor == pytest.approx(backend.anchor)


def test_adaptive_deadline_survives_a_checkpoint_restore():
    """T_anchor is in the checkpoint: after a restart the deadline is still 1.5 x the slowest correct
    answer, not back at t_max (a slow but correct scorer would otherwise be waited on for 30 s again)."""
    import json

    def build(checkpoint=None):
        return Scheduler(make_policy("sync", prompts=1, samples=1, max_tokens=8), num_prompts=4,
                         checkpoint=checkpoint)

    sched = build()
    rid = next(c for c in sched.begin_round() if isinstance(c, LaunchRequest)).request_id
    kept = [c for c in sched.handle(RequestFinished(rid, 4, "stop", at=1.0)) if isinstance(c, ScoreSample)]
    sched.start_scoring(kept[0].sample.request_id, at=1.0)
    sched.scoring_finished(rid, 1.0, at=5.0)  # correct, ran 4 s
    assert sched.reward_timeout == 6.0
    restored = build(json.loads(json.dumps(sched.to_dict())))
    assert restored.reward_timeout == 6.0
    assert build().reward_timeout == 30.0


def test_start_scoring_says_how_long_the_sample_waited_for_a_worker():
    sched = RewardScheduler(RewardConfig(workers=1))
    state, first = sched.submit(sched.initial(), request_id(0), at=1.0)
    state, queued = sched.submit(state, request_id(1), at=2.0)
    assert [s.queued_s for s in starts(first)] == [0.0] and not starts(queued)
    state, out = sched.finished(state, request_id(0), 1.0, True, at=5.5)
    assert [(s.request_id, s.queued_s) for s in starts(out)] == [(request_id(1), 3.5)]


@given(st.lists(st.floats(0.0, 50.0), min_size=1, max_size=20), st.floats(0.0, 100.0), st.floats(0.0, 50.0))
def test_expire_with_a_start_grace_cuts_exactly_the_deadlines_a_grace_past(arrivals, at, grace):
    """A backend whose executor may start a job late tells the core its start grace: the core then cuts
    only the scorings whose deadline plus the grace is <= at (`next_expiry` the first deadline plus
    the grace), every later one keeps running; the deadlines and time limits it gives do not move."""
    sched = RewardScheduler(RewardConfig(workers=len(arrivals), t_min=2.0, t_max=2.0, hedge_after=None))
    s, clock = sched.set_grace(sched.initial(), grace), 0.0
    for i, arrived in enumerate(sorted(arrivals)):
        clock = arrived
        s, out = sched.submit(s, request_id(i), arrived)
        assert [(c.deadline, c.at, c.time_limit) for c in starts(out)] == [(arrived + 2.0, arrived, pytest.approx(2.0))]
    at = max(at, clock)
    deadlines = {rid: deadline for _, (rid, deadline, _) in s.running.items()}
    assert s.next_expiry == min(deadlines.values()) + grace
    s, out = sched.expire(s, at)
    cut = {o.request_id for o in out if isinstance(o, RewardScored)}
    assert cut == {rid for rid, d in deadlines.items() if d + grace <= at}
    assert all(o.failed and o.at == at for o in out if isinstance(o, RewardScored))
    assert {rid for _, (rid, _, _) in s.running.items()} == set(deadlines) - cut
    assert s.timeouts == len(cut) and s.busy == len(deadlines) - len(cut)
    assert s.next_expiry is None or s.next_expiry > at


def test_start_grace_must_not_be_negative():
    sched = RewardScheduler()
    with pytest.raises(SchedulerMisuse, match="start grace"):
        sched.set_grace(sched.initial(), -1.0)
