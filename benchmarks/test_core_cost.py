"""pytest-benchmark suite for the core's own cost (not part of `make test`: testpaths is tests/).

    .venv/bin/python -m pytest benchmarks/test_core_cost.py --benchmark-enable -p no:cacheprovider

Targets: <= 50 ms to plan a 4,096-request step; <= 10 us per event through the Scheduler.
"""

from __future__ import annotations

import random

import pytest

from rollpacker.core import LaunchRequest, RequestFinished, RewardScored, Scheduler, ScoreSample, make_policy


def _planned(policy: str, prompts: int):
    sched = Scheduler(make_policy(policy, prompts=prompts, samples=8, max_tokens=8192), num_prompts=4 * prompts)
    return sched, sched.begin_round()


@pytest.mark.parametrize("policy,prompts", [("sync", 512), ("tail", 410)])
def test_plan_a_4096_request_step(benchmark, policy, prompts):
    _, commands = benchmark(_planned, policy, prompts)
    assert sum(isinstance(c, LaunchRequest) for c in commands) >= 4096


@pytest.mark.parametrize("policy,prompts", [("sync", 512)])
def test_events_of_a_4096_request_step(benchmark, policy, prompts):
    """Every request finishes (random order) and every kept sample gets its reward."""

    def setup():
        sched, commands = _planned(policy, prompts)
        rids = [c.request_id for c in commands if isinstance(c, LaunchRequest)]
        random.Random(0).shuffle(rids)
        return (sched, rids), {}

    def play(sched, rids):
        count = 0
        for rid in rids:
            for command in sched.handle(RequestFinished(rid, 100, "stop")):
                if isinstance(command, ScoreSample):
                    sched.handle(RewardScored(command.sample.request_id, 1.0))
                    count += 1
            count += 1
        return count

    events = benchmark.pedantic(play, setup=setup, rounds=3)
    assert events == 2 * 4096
    benchmark.extra_info["us_per_event"] = benchmark.stats.stats.min / events * 1e6
