"""The live backend's reward staging: kept samples' reward jobs on their way to the reward executor,
and the times the core must hear of.

A kept sample's job is staged (`stage`) until the core starts its scoring (`start`, a hedge starts the
same job again); the executor's answers are reduced to each sample's first (`answers`: the other
copies of a hedged one are cancelled).  Each job runs for its `StartScoring.time_limit`.  The hedge
times are a heap: once the clock passes one, `hedges_due` tells the driver's `wait`; once it passes
the core's next expiry, `expiry_passed` does, so the core expires a late scoring by its own deadline,
as in the simulator.  An executor that may start a job late (a `LateStartingRewardExecutor`: its pool
waits for a worker started in place of one killed at a deadline) times the job out from its own
start; `grace_news` tells the core its `start_grace_s`, and the core cuts a scoring only that long
past its deadline, so a scoring that waited for a worker is never cut before it ran."""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import attrs

from rollpacker.core import StartScoring
from rollpacker.core.protocols import LateStartingRewardExecutor, RewardExecutor, RewardJob, RewardOutcome

from .clock import Clock
from .loop import DeadlinePassed, HedgeDue, ScorerAnswered, StartGrace


class RewardStaging:
    def __init__(self, executor: RewardExecutor, clock: Clock) -> None:
        self.executor = executor
        self.clock = clock
        self._jobs: dict[str, RewardJob] = {}
        """Reward jobs of kept samples until their first answer (a hedge runs the same job again)."""
        self._hedged: set[str] = set()
        """Samples with hedged copies in flight: the first answer cancels the others."""
        self._hedge_due: list[float] = []
        """Heap of the StartScoring `hedge_at` times still ahead (each a HedgeDue for the core)."""
        self._told_grace: float | None = None
        """The executor's start grace as last told to the core (None: not yet)."""

    def stage(self, request_id: str, job: RewardJob) -> None:
        """A kept sample's job, until the core starts its scoring."""
        self._jobs[request_id] = job

    def start(self, command: StartScoring) -> None:
        """Send the job to the executor for the command's `time_limit` (its worker is killed past it);
        the core expires it by its own clock.  A hedge of a sample whose answer is already in hand is
        not sent: its answer came in this poll, and the core, fed an input of the same poll before it
        (a finished request, another answer, an expiry), freed or filled a worker and hedged the
        sample it has not been told of yet (its answer comes next)."""
        if command.copy and command.request_id not in self._jobs:
            return
        if command.copy:
            self._hedged.add(command.request_id)
        if command.hedge_at is not None:
            heapq.heappush(self._hedge_due, command.hedge_at)
        job = self._jobs[command.request_id]
        self.executor.submit(attrs.evolve(job, deadline_s=command.time_limit, copy=command.copy))

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

    def grace_news(self) -> list[StartGrace]:
        """A StartGrace for the core when the executor's start grace is not the one last told: read at
        each wait, since the pool's grows with the worker starts it measures.  An executor that
        starts every job on submission tells none (the core's grace stays 0)."""
        if not isinstance(self.executor, LateStartingRewardExecutor):
            return []
        grace = self.executor.start_grace_s
        if grace == self._told_grace:
            return []
        self._told_grace = grace
        return [StartGrace(grace)]

    def expiry_passed(self, expiry: float | None) -> list[DeadlinePassed]:
        """One DeadlinePassed once the clock reached `expiry`, the core's next reward expiry."""
        return [DeadlinePassed()] if expiry is not None and expiry <= self.clock.now() else []

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
