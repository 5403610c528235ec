"""The driver's watch over a step: a backend with nothing left to report while the step is not done
is the driver's one clear error (`StepStalled`), for the simulator and the live backend alike; the
notices reach an observer's methods by their type."""

from __future__ import annotations

import typing

import pytest

from rollpacker.core import Scheduler, make_policy
from rollpacker.driver import Notice, NoticeObserver, StepLoop, StepStalled, VirtualClock
from rollpacker.sim import SimConfig, Simulation

from test_step_loop import Prompts, RecordingTrainer, ScriptedEngine, ScriptedRewards


class LostScorer(Simulation):
    """The simulator whose scorer takes each kept sample and never answers (its deadline is lost too):
    the step's events run out before its rewards come.  A driver that does not see the stall would
    wait on it forever: past 10,000 waits the test fails instead of hanging."""

    waits = 0

    def start_scoring(self, command) -> None:
        self.lost = getattr(self, "lost", set()) | {command.request_id}  # (a hedge's copy too)

    def wait(self):
        self.waits += 1
        assert self.waits < 10_000, "the driver waited on a stalled simulator forever"
        return super().wait()


def test_a_simulator_with_nothing_left_to_happen_raises_the_drivers_stall_error():
    sim = LostScorer(SimConfig(policy="sync", prompts=2, samples=2, max_tokens=512, steps=1, instances=1))
    with pytest.raises(StepStalled, match=r"step 0 stalled at t=\d+\.\d{3}s of the step: the backend has nothing "
                                          r"left to report and the step is not done; 0 requests still running"):
        sim.run_step()
    assert len(sim.lost) == 4, "the case under test: every sample was kept and its scorer lost"


class SilentEngine(ScriptedEngine):
    """Takes the requests and never answers, in no time on a clock that nobody moves.  A driver that
    does not see the stall would poll it forever: past 100 polls the test fails instead of hanging."""

    polls = 0

    def poll(self, timeout=None):
        self.polls += 1
        assert self.polls < 100, "the driver polled a stalled backend forever"
        return []


def test_a_live_backend_that_can_report_nothing_raises_the_same_stall_error_naming_what_was_pending():
    calls: list = []
    clock = VirtualClock(start=5.0)
    engine = SilentEngine(calls)
    sched = Scheduler(make_policy("sync", prompts=2, samples=2, max_tokens=8), num_prompts=4)
    loop = StepLoop(sched, engine, ScriptedRewards(), RecordingTrainer(calls, engine), Prompts(), clock=clock)
    try:
        with pytest.raises(StepStalled, match=r"step 0 stalled at t=0\.000s of the step: .*; 4 requests still "
                                              r"running, round not ended, the trainer idle"):
            loop.run_step()
    finally:
        loop.close()
    assert engine.polls == 1


def test_every_notice_reaches_the_observer_method_named_for_its_type():
    assert set(NoticeObserver.METHODS) == set(typing.get_args(Notice))
    seen: list = []

    class Recording(NoticeObserver):
        def __getattribute__(self, name):
            if name in NoticeObserver.METHODS.values():
                return lambda notice: seen.append((name, notice))
            return super().__getattribute__(name)

    for kind, method in NoticeObserver.METHODS.items():
        notice = object.__new__(kind)
        Recording().observe(notice)
        assert seen.pop() == (method, notice)
    with pytest.raises(TypeError, match="Recording: no method for notice 'not a notice'"):
        Recording().observe("not a notice")  # type: ignore[arg-type]
