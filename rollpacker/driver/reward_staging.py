"""The live backend's reward staging: kept samples' reward jobs on their way to the reward executor,
and the times the core must hear of.

A kept sample's job is staged (`stage`) until the core starts its scoring (`start`, a hedge starts the
same job again); the executor's answers are reduced to each sample's first (`answers`: the other
copies of a hedged one are cancelled).  The `StartScoring` deadlines and hedge times are heaps: once
the clock passes one, `deadline_passed` / `hedges_due` tell the driver's `wait`, so the core expires
a late scoring by its own deadline, as in the simulator.  An executor that may start a job late (a
`LateStartingRewardExecutor`: its pool waits for a worker started in place of one killed at a
deadline) times the job out from its own start; the core's expiry then waits its `start_grace_s`
past a deadline, so a scoring that waited for a worker is never cut before it ran."""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import attrs

from rollpacker.core import StartScoring
from rollpacker.core.protocols import LateStartingRewardExecutor, RewardExecutor, RewardJob, RewardOutcome

from .clock import Clock
from .loop import HedgeDue, ScorerAnswered


class RewardStaging:
    def __init__(self, executor: RewardExecutor, clock: Clock) -> None:
        self.executor = executor
        self.clock = clock
        self._jobs: dict[str, RewardJob] = {}
        """Reward jobs of kept samples until their first answer (a hedge runs the same job again)."""
        self._deadlines: list[float] = []
        """The started scorings' `StartScoring.deadline`s, a heap."""
        self._hedged: set[str] = set()
        """Samples with hedged copies in flight: the first answer cancels the others."""
        self._hedge_due: list[float] = []
        """Heap of the StartScoring `hedge_at` times still ahead (each a HedgeDue for the core)."""

    @property
    def grace_s(self) -> float:
        """How long past a deadline the core expires (the executor's own timeout comes first): read
        at each use, since the pool's grace grows with the worker starts it measures."""
        executor = self.executor
        return executor.start_grace_s if isinstance(executor, LateStartingRewardExecutor) else 0.0

    def stage(self, request_id: str, job: RewardJob) -> None:
        """A kept sample's job, until the core starts its scoring."""
        self._jobs[request_id] = job

    def start(self, command: StartScoring) -> None:
        """Send the job to the executor with the core's timeout (its worker is killed past it; a hedge:
        the time left); the core expires it by its clock at `command.deadline`.  A hedge of a sample
        whose answer is already in hand is not sent: its answer came in this poll, and the core, fed
        an input of the same poll before it (a finished request, another answer, an expiry), freed or
        filled a worker and hedged the sample it has not been told of yet (its answer comes next)."""
        if command.copy and command.request_id not in self._jobs:
            return
        if command.copy:
            self._hedged.add(command.request_id)
        if command.hedge_at is not None:
            heapq.heappush(self._hedge_due, command.hedge_at)
        job = self._jobs[command.request_id]
        self.executor.submit(attrs.evolve(job, deadline_s=command.timeout, copy=command.copy))
        heapq.heappush(self._deadlines, command.deadline)

    def poll(self, timeout: float) -> list[RewardOutcome]:
        return list(self.executor.poll(timeout=timeout))

    def answers(self, outcomes: Sequence[RewardOutcome]) -> list[ScorerAnswered]:
        """Each sample's first answer (any copy's); the other copies of a hedged one are cancelled."""
        first = []
        for outcome in outcomes:
            if self._jobs.pop(outcome.request_id, None) is None:
                continue  # another copy answered first
            if outcome.request_id in self._hedged:
                self._hedged.discard(outcome.request_id)
                self.executor.cancel(outcome.request_id)
            first.append(ScorerAnswered(outcome.request_id, outcome.reward, outcome.failed, outcome.latency_s))
        return first

    def deadline_passed(self) -> float | None:
        """None, or once the clock passed a scoring's deadline by the grace: the time the core expires
        the deadlines up to (those passed are dropped)."""
        due = self.clock.now() - self.grace_s
        return due if _pop_due(self._deadlines, due) else None

    def hedges_due(self) -> list[HedgeDue]:
        """One HedgeDue once the clock passed a scoring's `hedge_at` (the core hedges every due one)."""
        return [HedgeDue()] if _pop_due(self._hedge_due, self.clock.now()) else []


def _pop_due(heap: list[float], now: float) -> int:
    """Pop the times in `heap` that `now` passed; how many there were."""
    count = 0
    while heap and heap[0] <= now:
        heapq.heappop(heap)
        count += 1
    return count
