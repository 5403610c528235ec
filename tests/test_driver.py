"""The one driver loop: it executes the core's commands in the core's order (consecutive launches as
one call), refuses a command it cannot route, reads only its injected clock, and runs the real
backends and the simulator alike."""

from __future__ import annotations

import threading
import typing

import pytest

from rollpacker.core import (
    AbortRequest,
    BatcherConfig,
    CloseGroup,
    Command,
    EndRound,
    LaunchRequest,
    PromptKey,
    RequestFinished,
    Sample,
    Scheduler,
    ScoreSample,
    Segment,
    SetTensorParallel,
    StartScoring,
    StepOptimizer,
    TrainMicroBatch,
    make_policy,
)
from rollpacker.driver import Driver, LoopConfig, ScorerAnswered, StepLoop, StepTimeout, VirtualClock
from rollpacker.sim import SimConfig, Simulation

from test_step_loop import Prompts, RecordingTrainer, ScriptedEngine, ScriptedRewards


class RecordingBackend:
    def __init__(self) -> None:
        self.calls: list = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name, *args))


def launch(n: int) -> LaunchRequest:
    return LaunchRequest(f"rp{n:012d}", PromptKey(0, 0), n, 8, 0, seed=n)


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


class CommandsOnlyBackend:
    """The Backend protocol's methods and nothing else: the driver must not send it a notice.  Every
    request finishes (4 tokens) at the next wait, every scorer answers reward 1 at the one after."""

    def __init__(self, log: list) -> None:
        self.log, self.answers = log, []

    def launch(self, commands) -> None:
        self.log.append(("launch", len(commands)))
        self.answers += [RequestFinished(c.request_id, 4, "stop") for c in commands]

    def abort(self, request_ids) -> None:
        self.log.append(("abort", tuple(request_ids)))

    def set_tensor_parallel(self, command) -> None:
        self.log.append(("set_tensor_parallel", command.tp))

    def start_scoring(self, command: StartScoring) -> None:
        self.log.append(("start_scoring", command.request_id))
        self.answers.append(ScorerAnswered(command.request_id, 1.0))

    def train(self, command) -> None:
        self.log.append(("train", command.index))

    def step_optimizer(self, command) -> None:
        self.log.append(("step_optimizer", command.step))

    def wait(self):
        answers, self.answers = self.answers, []
        return answers


class Notices:
    def __init__(self, log: list) -> None:
        self.log = log

    def observe(self, notice) -> None:
        rid = notice.sample.request_id if isinstance(notice, ScoreSample) else getattr(notice, "request_id", None)
        self.log.append((type(notice).__name__, rid))

    def finish_step(self, ledger, pending) -> dict:
        self.log.append(("finish_step", len(ledger.trained)))
        return {"trained": len(ledger.trained)}


def test_the_backend_gets_only_commands_and_the_observer_every_notice_in_order():
    """Sync P=2 R=2: the step's start, each kept sample before its scoring starts, each settled
    reward, each closed group and the round's end go to the observer; launches, scorings, training
    and the optimizer step to the backend; the record is the observer's."""
    log: list = []
    sched = Scheduler(make_policy("sync", prompts=2, samples=2, max_tokens=8), num_prompts=4)
    record = Driver(sched, CommandsOnlyBackend(log), VirtualClock(), observer=Notices(log)).run_step()
    assert record == {"trained": 2} and log[-1] == ("finish_step", 2)
    kinds = [k for k, _ in log]
    assert kinds[:2] == ["StepBegun", "launch"]
    kept = [rid for k, rid in log if k == "ScoreSample"]
    assert len(kept) == 4 and sorted(rid for k, rid in log if k == "start_scoring") == sorted(kept)
    assert sorted(rid for k, rid in log if k == "RewardScored") == sorted(kept)
    for rid in kept:  # told before its scorer runs, settled after
        assert log.index(("ScoreSample", rid)) < log.index(("start_scoring", rid)) < log.index(("RewardScored", rid))
    assert kinds.count("CloseGroup") == 2 and kinds.count("EndRound") == 1 and kinds.count("step_optimizer") == 1
    assert kinds.index("EndRound") < kinds.index("step_optimizer")


def test_a_backend_that_does_not_observe_needs_an_observer():
    sched = Scheduler(make_policy("sync", prompts=1, samples=1, max_tokens=8), num_prompts=1)
    with pytest.raises(TypeError, match="CommandsOnlyBackend does not observe"):
        Driver(sched, CommandsOnlyBackend([]))


def test_every_core_command_has_a_route_and_start_scoring_is_one():
    """Each member of `Command` goes to the backend or the observer; none is refused."""
    assert StartScoring in typing.get_args(Command)
    backend = RecordingBackend()
    sched = Scheduler(make_policy("sync", prompts=1, samples=1, max_tokens=8), num_prompts=1)
    sample = Sample("rp000000000001", PromptKey(0, 0), 0, (Segment("rp000000000001", 4, 0),), "stop")
    examples = {
        SetTensorParallel: SetTensorParallel(2), LaunchRequest: launch(1), AbortRequest: AbortRequest("rp000000000001"),
        ScoreSample: ScoreSample(sample), StartScoring: StartScoring("rp000000000001", 30.0, 0.0),
        CloseGroup: CloseGroup(PromptKey(0, 0), (sample,)), TrainMicroBatch: TrainMicroBatch(0, 0, ()),
        StepOptimizer: StepOptimizer(0, 1.0, 0, 0, 0),
        EndRound: EndRound(0, "normal", (PromptKey(0, 0),), None),  # type: ignore[arg-type]
    }
    assert set(examples) == set(typing.get_args(Command))
    for kind, command in examples.items():
        backend.calls.clear()
        Driver(sched, backend).execute([command])
        assert backend.calls, f"{kind.__name__} went nowhere"
    assert backend.calls[-1] == ("observe", examples[EndRound])


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
    # the last rewards come on the poll after the round's end: a second of reward wait, nothing after it
    assert (record["reward_s"], record["train_exposed_s"], record["sync_s"]) == (1.0, 0.0, 0.0)
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


class AbortWatchingEngine(TickingEngine):
    """The ticking engine that notes the clock second at which the P-th group has R answers, the
    clock of each abort and of its last answer."""

    def __init__(self, calls: list, clock: VirtualClock, prompts: int, samples: int) -> None:
        super().__init__(calls, clock)
        self.prompts, self.samples = prompts, samples
        self.pth_group_at: float | None = None
        self.last_answer_at: float | None = None
        self.answered: dict = {}  # answers per group
        self.groups: dict = {}

    def submit(self, requests) -> None:
        self.groups.update({r.request_id: r.group for r in requests})
        super().submit(requests)

    def poll(self, timeout=None):
        out = super().poll(timeout)
        for r in out:
            self.last_answer_at = self.clock.now()
            if r.finish_reason != "abort":
                group = self.groups[r.request_id]
                self.answered[group] = self.answered.get(group, 0) + 1
        if self.pth_group_at is None and sum(n >= self.samples for n in self.answered.values()) == self.prompts:
            self.pth_group_at = self.clock.now()
        return out

    def abort(self, request_ids) -> None:
        self.calls.append(("abort at", self.clock.now()))
        super().abort(request_ids)


class LongMicroBatchTrainer(RecordingTrainer):
    """Each micro-batch trains until the round is over (`round_over`, opened once the driver has
    ended it), then 100 clock seconds more: training that outlives the round.  Called on the driver's
    own thread (a synchronous loop), it cannot see the round end (the driver is inside the call), so
    it takes its 100 s at once."""

    def __init__(self, calls: list, engine: AbortWatchingEngine, clock: VirtualClock) -> None:
        super().__init__(calls, engine)
        self.clock, self.driver_thread = clock, threading.current_thread()
        self.round_over = threading.Event()
        self.started = threading.Event()

    def forward_backward(self, batch):
        self.calls.append(("train starts at", self.clock.now()))
        self.started.set()
        if threading.current_thread() is not self.driver_thread:
            assert self.round_over.wait(timeout=120), "the round never ended while training ran"
        self.clock.advance_to(self.clock.now() + 100.0)
        stats = super().forward_backward(batch)
        self.calls.append(("train returns",))
        return stats


@pytest.mark.timeout(180)
def test_a_long_micro_batch_does_not_hold_the_round_it_ends_and_aborts_when_the_pth_group_completes():
    """Tail batching (3 groups of 3 for P=2, R=2) on the ticking engine: one answer per clock second.
    The first group's micro-batch starts training and runs past the round; meanwhile the driver
    still sees the engine's answers, ends the round and aborts the tail at the clock second the P-th
    group completes (not 100 s later, after training returns), and the optimizer step then waits
    for every micro-batch."""
    calls: list = []
    clock = VirtualClock(start=100.0)
    engine = AbortWatchingEngine(calls, clock, prompts=2, samples=2)
    trainer = LongMicroBatchTrainer(calls, engine, clock)
    sched = Scheduler(make_policy("tail", prompts=2, samples=2, max_tokens=8), num_prompts=4,
                      batcher=BatcherConfig(token_budget=1))
    loop = StepLoop(sched, engine, ScriptedRewards(), trainer, Prompts(), clock=clock)
    end_round = loop.live.end_round

    def round_ended(command):  # the test watches the backend end the round, then lets training go on
        end_round(command)
        trainer.round_over.set()

    loop.live.end_round = round_ended
    hand_over = loop.live.train

    def train_started(command):  # the clock moves only once the worker took the micro-batch: no race
        hand_over(command)        # with the worker thread's wake-up on the virtual clock
        if threading.current_thread() is trainer.driver_thread and not trainer.started.is_set():
            assert trainer.started.wait(timeout=60), "the worker never started the micro-batch"

    loop.live.train = train_started
    record = loop.run_step()
    loop.close()

    names = [c[0] for c in calls]
    # the tail is aborted when the P-th group completes (a group's spare answers are aborted earlier)
    round_abort = calls.index(("abort at", engine.pth_group_at))
    assert engine.pth_group_at - 100.0 < 10, "the P-th group completes at once, not after training returns"
    assert names.index("train starts at") < round_abort < names.index("train returns"), \
        "the round's tail was aborted while a micro-batch was training"
    assert record["rollout_s"] == engine.last_answer_at - 100.0 < 20, \
        "the round ends when its aborted requests are back, on the engine's clock seconds alone"
    assert not [c for c in calls if c[0] == "abort at" and c[1] > engine.pth_group_at]
    assert names.count("train returns") == 4 and names.index("optimizer_step") > max(
        i for i, n in enumerate(names) if n == "train returns"), "the optimizer step waits for every micro-batch"
    assert [n for n in names if n in ("pause", "update_weights", "resume")] == ["pause", "update_weights", "resume"]
    assert record["train_overlapped_s"] > 0 and record["train_exposed_s"] >= 4 * 100.0
    assert record["step_s"] == pytest.approx(record["rollout_s"] + record["reward_s"] + record["train_exposed_s"]
                                             + record["sync_s"])
