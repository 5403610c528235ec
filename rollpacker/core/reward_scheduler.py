"""Reward scheduler: per-sample asynchronous scoring with a worker budget and adaptive timeouts.

Theory of operation
-------------------
The planner asks for a kept sample to be scored (ScoreSample); the driver hands it here with
`submit` (through the core's Scheduler, which holds this scheduler and its state:
`Scheduler.start_scoring`, `scoring_finished`, `expire_rewards`).  At most `workers` samples are scored at once; the rest wait in arrival order (samples
that finish first are scored first, so rewards stream with the rollout).  Each started sample gets
a deadline, RollPacker's adaptive timeout (arXiv 2509.21009, section 5):

    T = min(max(T_min, scale * T_anchor), T_max)       defaults 2 s, 1.5, 30 s

T_anchor is the slowest *correct* execution seen so far: a correct answer that took that long is
evidence that legitimate work can take that long; slow wrong answers (loops, hangs) are not.  Until
a correct execution is seen, T = T_max.  A sample whose scorer has not answered by its deadline is
a recorded failure with reward 0 (`RewardScored(failed=True)`), its worker is freed, and a late
answer is ignored: a hanging verifier never stalls the step.  A scorer that raised is reported by
the driver as `finished(..., failed=True)` and gives reward 0 as well.

Pure: `(state, input) -> (state, outputs)`, where outputs are `StartScoring` commands for the driver
and `RewardScored` events for the core's Scheduler.  Time is an input (`at`); the driver calls
`expire(state, at)` when the clock passes `state.next_deadline`.
"""

from __future__ import annotations

import attrs
from attrs import field, frozen
from immutables import Map

from .commands import StartScoring
from .errors import ConfigError, SchedulerMisuse
from .events import RewardScored
from .records import request_number
from .validators import positive_number


@frozen(kw_only=True)
class RewardConfig:
    workers: int = field(default=64, validator=positive_number)
    """Samples scored at once (sandbox / verifier processes)."""
    t_min: float = field(default=2.0, validator=positive_number)
    scale: float = field(default=1.5, validator=positive_number)
    """lambda: the timeout is this multiple of the slowest correct execution."""
    t_max: float = field(default=30.0, validator=positive_number)

    def __attrs_post_init__(self) -> None:
        if self.t_min > self.t_max:
            raise ConfigError(f"reward t_min ({self.t_min}) must be <= t_max ({self.t_max})")

    def timeout(self, anchor: float | None) -> float:
        if anchor is None:
            return self.t_max
        return min(max(self.t_min, self.scale * anchor), self.t_max)


@frozen
class RewardState:
    queue: Map = field(factory=Map)
    """arrival ticket -> (request id, arrival time), waiting for a worker."""
    head: int = 0
    tail: int = 0
    running: Map = field(factory=Map)
    """request number -> (request id, started at, deadline)."""
    anchor: float | None = None
    """Slowest correct execution so far (T_anchor)."""
    scored: int = 0
    timeouts: int = 0
    failures: int = 0

    @property
    def next_deadline(self) -> float | None:
        deadlines = [d for _, (_, _, d) in self.running.items()]
        return min(deadlines) if deadlines else None

    @property
    def num_waiting(self) -> int:
        return self.tail - self.head


class RewardScheduler:
    def __init__(self, config: RewardConfig | None = None) -> None:
        self.config = config or RewardConfig()

    def initial(self) -> RewardState:
        return RewardState()

    def submit(self, state: RewardState, request_id: str, at: float) -> tuple[RewardState, list]:
        state = attrs.evolve(state, queue=state.queue.set(state.tail, (request_id, at)), tail=state.tail + 1)
        return self._start(state, at, [])

    def finished(self, state: RewardState, request_id: str, reward: float, correct: bool, at: float,
                 failed: bool = False, seconds: float | None = None) -> tuple[RewardState, list]:
        """The scorer of `request_id` answered at `at`, having run `seconds` (a driver that measured it;
        else the time since it started).  A late answer (after its timeout) is ignored."""
        number = request_number(request_id)
        entry = state.running.get(number)
        if entry is None:
            return state, []
        _, started, _ = entry
        anchor = state.anchor
        if correct and not failed:
            anchor = max(anchor or 0.0, at - started if seconds is None else seconds)
        state = attrs.evolve(state, running=state.running.delete(number), anchor=anchor,
                             scored=state.scored + 1, failures=state.failures + int(failed))
        out: list = [RewardScored(request_id, 0.0 if failed else reward, failed, at)]
        return self._start(state, at, out)

    def expire(self, state: RewardState, at: float) -> tuple[RewardState, list]:
        """Time out every running sample whose deadline is <= `at`."""
        out: list = []
        running = state.running
        for number, (rid, _, deadline) in sorted(state.running.items()):
            if deadline <= at:
                running = running.delete(number)
                out.append(RewardScored(rid, 0.0, True, at))
        if not out:
            return state, []
        state = attrs.evolve(state, running=running, timeouts=state.timeouts + len(out),
                             scored=state.scored + len(out))
        return self._start(state, at, out)

    def _start(self, state: RewardState, at: float, out: list) -> tuple[RewardState, list]:
        queue, head, running = state.queue, state.head, state.running
        timeout = self.config.timeout(state.anchor)
        while head < state.tail and len(running) < self.config.workers:
            rid, arrived = queue[head]
            queue = queue.delete(head)
            head += 1
            number = request_number(rid)
            if number in running:
                raise SchedulerMisuse(f"reward scheduler: {rid} submitted twice")
            running = running.set(number, (rid, at, at + timeout))
            out.append(StartScoring(rid, at + timeout, timeout, at - arrived))
        return attrs.evolve(state, queue=queue, head=head, running=running), out
