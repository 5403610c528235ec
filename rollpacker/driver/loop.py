"""Driver: the one loop that runs the core's `Scheduler` against a backend, one training step at a time.

It owns no scheduling logic and no I/O.  It feeds the core what the backend reports (engine events,
scorer answers, passed reward deadlines) with the time of its injected clock, and executes each
command the core returns by calling the backend method of the same name, in the core's order.  The
real engine, reward executor and trainer are one backend (`live.LiveBackend`, behind `StepLoop`);
the simulator is another (`rollpacker.sim.Simulation`): both run this loop.

    driver = Driver(scheduler, backend, clock)
    record = driver.run_step()       # begin a round, loop until the optimizer step, the step's metrics

The backend gets only what it must do (`Backend`: launch, abort, set_tensor_parallel,
start_scoring, train, step_optimizer, wait).  What it may want to know goes to one observer hook,
`Observer.observe(notice)`: the step's start (`StepBegun`), a sample kept for scoring
(`ScoreSample`), the reward the core settled (`RewardScored`), a closed group (`CloseGroup`), the
round's end (`EndRound`); `Observer.finish_step` makes the step's record.  A backend that also
observes (LiveBackend, the simulator, the test harness) is its own observer unless given another;
`observer.NoticeObserver` routes each notice to a method by its type.

The driver watches each step (`watchdog.StepWatch`): past its time limit it raises `StepTimeout`,
and a backend whose `wait` reports nothing while the clock stands still (nothing can ever happen:
a deadlock) raises `StepStalled`, live and simulated alike.

Scoring: a `ScoreSample` is told to the observer first (the backend prepares the sample's reward
job), then handed to the core's reward scheduler; each `StartScoring` it gives back (RollPacker's
adaptive deadline included) is a command like the others, and the scorers' answers come back
through `wait` as `ScorerAnswered`; once the clock passes the core's next expiry (a
`StartScoring.deadline`, plus the start grace a backend's reward executor told the core with
`StartGrace`), the backend's `wait` returns `DeadlinePassed` and the core times out what that expiry
cut (live and simulated alike: one expiry path, an answer after it is ignored); a backend whose
StartScoring has a `hedge_at` reports `HedgeDue` when its clock passes it (the core may then start a
second copy, `copy=1`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Protocol

from attrs import frozen

from rollpacker.core import EpochLedger, Scheduler, commands, events
from rollpacker.core.records import PromptKey

from .clock import Clock, WallClock
from .observer import Observer, StepBegun
from .watchdog import StepWatch


@frozen
class ScorerAnswered:
    """A scorer's answer for a kept sample; a failed one (error, timeout) counts as reward 0."""

    request_id: str
    reward: float
    failed: bool = False
    seconds: float | None = None
    """How long the scorer ran, if the backend measured it (else the core counts from its start)."""


@frozen
class DeadlinePassed:
    """The clock reached the core's next reward expiry (`Scheduler.next_reward_expiry`): every
    scoring whose expiry passed times out."""


@frozen
class StartGrace:
    """The backend's reward executor may start a job up to `seconds` after its StartScoring (waiting
    for a replacement worker) and times it out from that start: the core cuts a scoring only this long
    past its deadline, so never before the executor's own timeout."""

    seconds: float


@frozen
class HedgeDue:
    """The clock reached a StartScoring's `hedge_at`: a slow execution may get a second copy."""


Input = events.RequestFinished | events.RequestAborted | ScorerAnswered | DeadlinePassed | HedgeDue | StartGrace


class Backend(Protocol):
    """What the driver executes the core's commands against: only real work."""

    def set_tensor_parallel(self, command: commands.SetTensorParallel) -> None:
        """Run the rollout at another TP from this round on (only a Scheduler given a TpRule asks)."""

    def launch(self, launches: Sequence[commands.LaunchRequest]) -> None: ...

    def abort(self, request_ids: Sequence[str]) -> None: ...

    def start_scoring(self, command: commands.StartScoring) -> None:
        """Run the kept sample's scorer for `command.time_limit`; the core gives up on it at
        `command.deadline`."""

    def train(self, command: commands.TrainMicroBatch) -> None:
        """Start training the micro-batch and return without waiting for it: the loop must go on
        feeding the core (a round ends, and its tail is aborted, while training runs)."""

    def step_optimizer(self, command: commands.StepOptimizer) -> None:
        """Wait for every micro-batch of the step, step the optimizer, sync the weights."""

    def wait(self) -> Sequence[Input]:
        """Block (or, simulated, move the clock) until something happens; return what happened.
        Nothing returned with the clock where it was means nothing more will happen: the driver
        raises `StepStalled`."""


_BACKEND_METHOD = {
    commands.SetTensorParallel: "set_tensor_parallel",
    commands.StartScoring: "start_scoring",
    commands.TrainMicroBatch: "train",
    commands.StepOptimizer: "step_optimizer",
}
"""Commands that one backend call executes (launches and aborts go in runs: `Driver.execute`)."""


class Driver:
    def __init__(self, scheduler: Scheduler, backend: Backend, clock: Clock | None = None,
                 observer: Observer | None = None, watch: StepWatch | None = None) -> None:
        self.sched = scheduler
        self.backend = backend
        if observer is None and not (hasattr(backend, "observe") and hasattr(backend, "finish_step")):
            raise TypeError(f"driver: {type(backend).__name__} does not observe (no observe/finish_step): "
                            "pass Driver(..., observer=...)")
        self.observer: Observer = observer if observer is not None else backend  # type: ignore[assignment]
        self.clock = clock or WallClock()
        self.watch = watch or StepWatch(scheduler, self.clock)
        """The step's time limit (none unless given) and deadlock detection."""
        self.ledger = EpochLedger()
        """Prompt keys trained so far (duplicates are counted, never expected)."""

    def run_step(self) -> dict:
        """Play one round, train it with one optimizer step; return the step's metrics."""
        opening = self.sched.begin_round()
        self.watch.begin()
        self.observer.observe(StepBegun(tuple(opening)))
        self.execute(opening)
        while not self.sched.step_done:
            for item in self.wait():
                self.execute(self.feed(item))
        return self.observer.finish_step(self.ledger, self.pending_prompts())

    def wait(self) -> Sequence[Input]:
        """The backend's next reports; `StepTimeout` once the step ran past its limit (checked before
        each wait), `StepStalled` when the backend reports nothing and the clock stands still."""
        if self.watch.is_over():
            raise self.watch.timed_out(self.pending_work())
        before = self.clock.now()
        inputs = self.backend.wait()
        if not inputs and self.clock.now() == before:
            raise self.watch.stalled(self.pending_work())
        return inputs

    def pending_work(self) -> str:
        """What the backend says it still waits for, for the watch's errors (empty if it does not say)."""
        describe = getattr(self.backend, "pending_work", None)
        return describe() if describe is not None else ""

    def pending_prompts(self) -> frozenset[PromptKey]:
        """Prompts drawn from the pool and not trained yet (running, deferred or returned)."""
        pool = self.sched.state.pool
        return frozenset(pool.in_flight) | frozenset(pool.deferred) | frozenset(pool.returned)

    def feed(self, item: Input) -> list:
        """Hand one backend report to the core; return the commands it answers with."""
        now = self.clock.now()
        if isinstance(item, ScorerAnswered):
            reward = 0.0 if item.failed else item.reward
            return self.sched.scoring_finished(item.request_id, reward, now, item.failed, seconds=item.seconds)
        if isinstance(item, DeadlinePassed):
            return self.sched.expire_rewards(now)
        if isinstance(item, StartGrace):
            self.sched.set_reward_grace(item.seconds)
            return []
        if isinstance(item, HedgeDue):
            return self.sched.hedge_rewards(now)
        return self.sched.handle(item)

    def execute(self, issued: Sequence) -> None:
        """Run the commands in order; consecutive launches (and aborts) go to the backend as one call."""
        for kind, run in itertools.groupby(issued, key=type):
            if kind is commands.LaunchRequest:
                self.backend.launch(list(run))
            elif kind is commands.AbortRequest:
                self.backend.abort([c.request_id for c in run])
            else:
                for command in run:
                    self._run_one(command)

    def _run_one(self, command) -> None:
        kind = type(command)
        method = _BACKEND_METHOD.get(kind)
        if method is not None:
            getattr(self.backend, method)(command)  # (looked up per call: a test may wrap a backend's method)
        elif kind is commands.ScoreSample:
            self.observer.observe(command)
            self.execute(self.sched.start_scoring(command.sample.request_id, self.clock.now()))
        elif kind is events.RewardScored or kind is commands.CloseGroup:
            self.observer.observe(command)
        elif kind is commands.EndRound:
            self.ledger = self.ledger.record(command.trained)
            self.observer.observe(command)
        else:
            raise TypeError(f"driver: no backend method for command {command!r}")
