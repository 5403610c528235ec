"""The reward stage after the round: hedged executions and complete groups scored first (core,
property-tested).  A hung or slow execution gets a second copy on a free worker `hedge_after` seconds
after it started, the first answer is the sample's one reward; the samples of complete groups start
before any open group's."""

from __future__ import annotations

import heapq
import itertools
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollpacker.core import RewardScored
from rollpacker.core.records import request_id
from rollpacker.core.reward_scheduler import RewardConfig, RewardScheduler, StartScoring

HANG = math.inf


class Scorers:
    """Runs the core's StartScoring on a virtual clock: execution k of sample i takes times[i][k]
    seconds (inf: a hang); wakes the core at each `hedge_at` and at each deadline."""

    def __init__(self, config: RewardConfig, times) -> None:
        self.sched, self.times, self.config = RewardScheduler(config), times, config
        self.state, self.now = self.sched.initial(), 0.0
        self.heap, self.tick = [], itertools.count()
        self.started: dict[str, list[float]] = {}
        self.deadline: dict[str, float] = {}
        self.answers: list[RewardScored] = []

    def take(self, out) -> None:
        for item in out:
            if isinstance(item, StartScoring):
                runs = self.started.setdefault(item.request_id, [])
                assert item.at == self.now
                assert item.copy == len(runs) <= self.config.hedge_copies, "copies one after another, at most hedge_copies"
                if item.copy:
                    assert item.deadline == self.deadline[item.request_id] and item.time_limit == item.deadline - self.now
                self.deadline[item.request_id] = item.deadline
                runs.append(self.now)
                seconds = self.times[int(item.request_id[2:])][item.copy]
                if seconds < item.time_limit:
                    self.push(self.now + seconds, ("answer", item.request_id, seconds))
                self.push(item.deadline, ("deadline",))
                if item.hedge_at is not None:
                    self.push(item.hedge_at, ("hedge",))
            else:
                self.answers.append(item)
        limit = self.config.workers + self.config.burst_workers
        assert self.state.busy == sum(len(s) for _, (_, _, s) in self.state.running.items()) <= limit

    def push(self, at, what) -> None:
        heapq.heappush(self.heap, (at, next(self.tick), what))

    def run(self) -> None:
        for i in range(len(self.times)):
            self.state, out = self.sched.submit(self.state, request_id(i), 0.0)
            self.take(out)
        while self.heap:
            self.now, _, what = heapq.heappop(self.heap)
            if what[0] == "answer":
                self.state, out = self.sched.finished(self.state, what[1], 1.0, True, self.now, seconds=what[2])
            elif what[0] == "deadline":
                self.state, out = self.sched.expire(self.state, self.now)
            else:
                self.state, out = self.sched.hedge(self.state, self.now)
            self.take(out)


execution = st.one_of(st.floats(0.01, 40.0), st.just(HANG))


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(execution, execution), min_size=1, max_size=30), st.integers(1, 8),
       st.sampled_from([None, 0.5, 2.0]), st.integers(0, 3))
def test_each_sample_is_answered_once_by_its_deadline_whatever_hedges_run(times, workers, hedge_after, burst):
    scorers = Scorers(RewardConfig(workers=workers, hedge_after=hedge_after, burst_workers=burst), times)
    scorers.run()
    assert sorted(a.request_id for a in scorers.answers) == [request_id(i) for i in range(len(times))]
    for a in scorers.answers:
        assert a.at <= scorers.deadline[a.request_id] and (not a.failed or a.reward == 0.0)
    assert not scorers.state.running and scorers.state.busy == 0 and not scorers.state.queue
    if hedge_after is None:
        assert all(len(s) == 1 for s in scorers.started.values())


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.one_of(st.floats(3.0, 40.0), st.just(HANG)), st.floats(0.01, 1.0)),
                min_size=1, max_size=12))
def test_with_a_free_worker_a_hung_or_slow_execution_is_hedged_not_waited_out(times):
    """Spare workers: a sample whose first execution hangs (or runs past 2 s) is answered by its
    second copy, started 2 s in: correct, at 2 s + the copy's time, never at the 30 s deadline."""
    scorers = Scorers(RewardConfig(workers=2 * len(times), hedge_after=2.0), times)
    scorers.run()
    for a in scorers.answers:
        first, copy = times[int(a.request_id[2:])]
        assert not a.failed and a.reward == 1.0
        assert a.at == min(first, 2.0 + copy) < 30.0
    assert scorers.state.hedges == len(times) and scorers.state.timeouts == 0


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=2, max_size=40), st.integers(1, 3),
       st.integers(0, 2))
def test_samples_of_complete_groups_start_first_and_get_the_burst_workers(arrivals, workers, burst):
    """Samples arrive (group, does it complete now?); each scoring runs 1 s.  A sample of an open
    group starts only on one of the `workers` and only while no complete group's sample waits; while
    one waits, all `workers + burst_workers` are busy."""
    sched = RewardScheduler(RewardConfig(workers=workers, hedge_after=None, burst_workers=burst))
    s, complete, members, waiting = sched.initial(), set(), {}, set()
    heap, now = [], 0.0

    def started(out, busy_before):
        busy = busy_before
        for item in out:
            if isinstance(item, RewardScored):
                busy -= 1
            elif isinstance(item, StartScoring):
                group = members[item.request_id]
                if group not in complete:
                    assert busy < workers, f"{item.request_id} of open group {group} took a burst worker"
                    assert not {r for r in waiting if members[r] in complete}, \
                        f"{item.request_id} of open group {group} started while a complete group's sample waited"
                busy += 1
                waiting.discard(item.request_id)
                heapq.heappush(heap, (now + 1.0, item.request_id))
        assert busy == s.busy
        if {r for r in waiting if members[r] in complete}:
            assert s.busy == workers + burst, "a complete group's sample waits while a worker is free"

    for i, (group, closes) in enumerate(arrivals):
        rid = request_id(i)
        members[rid] = group
        waiting.add(rid)
        busy = s.busy
        s, out = sched.submit(s, rid, now, first=group in complete)
        started(out, busy)
        if closes and group not in complete:
            complete.add(group)
            s = sched.promote(s, [r for r, g in members.items() if g == group])
            busy = s.busy
            s, out = sched.hedge(s, now)  # (the next input starts them on burst workers)
            started(out, busy)
        if heap and i % 3 == 2:  # time passes: the next scoring answers
            now, rid = heapq.heappop(heap)
            busy = s.busy
            s, out = sched.finished(s, rid, 1.0, True, now)
            started(out, busy)
    while heap:
        now, rid = heapq.heappop(heap)
        busy = s.busy
        s, out = sched.finished(s, rid, 1.0, True, now)
        started(out, busy)
    assert not waiting and s.scored == len(arrivals)
