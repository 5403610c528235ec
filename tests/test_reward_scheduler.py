"""Reward scheduler: worker budget, adaptive timeout, failures are reward 0, never a stuck step."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollpacker.core import ConfigError, RewardScored, request_id
from rollpacker.core.reward_scheduler import RewardConfig, RewardScheduler, StartScoring


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
    sched = RewardScheduler(RewardConfig(workers=2))
    s = sched.initial()
    s, out = sched.submit(s, request_id(1), 0.0)
    s, out2 = sched.submit(s, request_id(2), 0.0)
    s, out3 = sched.submit(s, request_id(3), 0.0)
    assert len(starts(out + out2)) == 2 and not starts(out3) and s.num_waiting == 1
    assert starts(out)[0].timeout == 30.0
    s, out = sched.finished(s, request_id(1), 1.0, True, 4.0)  # correct after 4 s: anchor 4
    assert out[0] == RewardScored(request_id(1), 1.0, False, 4.0)
    (start,) = starts(out)
    assert start.request_id == request_id(3) and start.timeout == 6.0 and start.deadline == 10.0
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
