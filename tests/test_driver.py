"""The one driver loop: it executes the core's commands in the core's order (consecutive launches as
one call), refuses a command it cannot route, reads only its injected clock, and runs the real
backends and the simulator alike."""

from __future__ import annotations

import pytest

from rollpacker.core import (
    AbortRequest,
    BatcherConfig,
    LaunchRequest,
    PromptKey,
    Scheduler,
    TrainMicroBatch,
    make_policy,
)
from rollpacker.driver import Driver, LoopConfig, StepLoop, StepTimeout, VirtualClock
from rollpacker.sim import SimConfig, Simulation

from test_step_loop import Prompts, RecordingTrainer, ScriptedEngine, ScriptedRewards


class RecordingBackend:
    def __init__(self) -> None:
        self.calls: list = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name, *args))


def launch(n: int) -> LaunchRequest:
    return LaunchRequest(f"rp{n:012d}", PromptKey(0, 0), n, 8, 0)


def test_commands_run_in_the_cores_order_with_consecutive_launches_batched():
    backend = RecordingBackend()
    driver = Driver(Scheduler(make_policy("sync", prompts=1, samples=1, max_tokens=8), num_prompts=1), backend)
    train = TrainMicroBatch(0, 0, ())
    driver.execute([launch(1), launch(2), AbortRequest("rp000000000001"), AbortRequest("rp000000000002"),
                    launch(3), train])
    assert backend.calls == [("launch", [launch(1), launch(2)]), ("abort", ["rp000000000001", "rp000000000002"]),
                             ("launch", [launch(3)]), ("train", train)]


def test_a_command_without_a_backend_method_is_an_error_not_a_silent_drop():
    driver = Driver(Scheduler(make_policy("sync", prompts=1, samples=1, max_tokens=8), num_prompts=1),
                    RecordingBackend())
    with pytest.raises(TypeError, match="no backend method"):
        driver.execute(["not a command"])


class TickingEngine(ScriptedEngine):
    """The scripted engine on simulated time: every poll takes exactly one second."""

    def __init__(self, calls: list, clock: VirtualClock, answer: bool = True) -> None:
        super().__init__(calls)
        self.clock, self.answer = clock, answer

    def poll(self, timeout=None):
        self.clock.advance_to(self.clock.now() + 1.0)
        return super().poll(timeout) if self.answer else []


def test_real_backend_times_come_from_the_injected_clock():
    """One request answers per poll and each poll is one clock second: 4 requests, 4 seconds of rollout,
    and one more poll for the last group's rewards."""
    calls: list = []
    clock = VirtualClock(start=100.0)
    engine = TickingEngine(calls, clock)
    sched = Scheduler(make_policy("sync", prompts=2, samples=2, max_tokens=8), num_prompts=4,
                      batcher=BatcherConfig(token_budget=1))
    loop = StepLoop(sched, engine, ScriptedRewards(), RecordingTrainer(calls, engine), Prompts(), clock=clock)
    record = loop.run_step()
    assert record["rollout_s"] == 4.0 and record["step_s"] == 5.0
    assert [i.end for i in loop.last_timeline] == [1.0, 2.0, 3.0, 4.0]  # seconds from the step's start


def test_step_timeout_is_measured_on_the_injected_clock():
    """An engine that never answers fails the step after step_timeout_s clock seconds, not wall seconds."""
    calls: list = []
    clock = VirtualClock()
    engine = TickingEngine(calls, clock, answer=False)
    sched = Scheduler(make_policy("sync", prompts=2, samples=2, max_tokens=8), num_prompts=4)
    loop = StepLoop(sched, engine, ScriptedRewards(), RecordingTrainer(calls, engine), Prompts(),
                    LoopConfig(step_timeout_s=30.0), clock=clock)
    with pytest.raises(StepTimeout, match="4 requests still running"):
        loop.run_step()
    assert 30.0 < clock.now() <= 32.0


def test_the_simulator_is_a_backend_of_the_same_driver_on_virtual_time():
    sim = Simulation(SimConfig(policy="tail", prompts=8, samples=4, max_tokens=4096, steps=3, instances=2))
    result = sim.run()
    assert type(sim.driver) is Driver and sim.driver.backend is sim
    assert sim.clock.now() == pytest.approx(sum(s["step_s"] for s in result["steps"]))
    assert sim.driver.ledger.duplicates == 0 and len(sim.driver.ledger.trained) == 8 * 3
