"""Reward scheduler: per-sample asynchronous scoring with a worker budget and adaptive timeouts.

Theory of operation
-------------------
The planner asks for a kept sample to be scored (ScoreSample); the driver hands it here with
`submit` (through the core's Scheduler, which holds this scheduler and its state:
`Scheduler.start_scoring`, `scoring_finished`, `expire_rewards`).  At most `workers` executions run
at once (`workers + burst_workers` for complete groups' samples and hedges); the rest wait in
arrival order (samples that finish first are scored first, so rewards stream with the rollout),
except that with `priority` the samples of a complete group (`promote`, on its CloseGroup) go
before every sample of a group still open: the groups that close the round are the ones its step
waits for.  Each started sample gets a deadline, RollPacker's adaptive
timeout (arXiv 2509.21009, section 5):

    T = min(max(T_min, scale * T_anchor), T_max)       defaults 2 s, 1.5, 30 s

T_anchor is the slowest *correct* execution seen so far: a correct answer that took that long is
evidence that legitimate work can take that long; slow wrong answers (loops, hangs) are not.  Until
a correct execution is seen, T = T_max.  A sample whose scorer has not answered by its deadline is
a recorded failure with reward 0 (`RewardScored(failed=True)`), its worker is freed, and a late
answer is ignored: a hanging verifier never stalls the step.  A scorer that raised is reported by
the driver as `finished(..., failed=True)` and gives reward 0 as well.

Hedging (`hedge_after`): an execution still running `hedge_after` seconds after it started, while
no complete group's sample waits and a worker is free, is started once more on that worker
(`StartScoring` with `copy=1`, the same deadline; then copy 2 `hedge_after` later, up to
`hedge_copies`).  The first answer of any copy is the sample's one reward; the others' answers are
ignored (a backend cancels them).  A hang or a slow execution then costs about `hedge_after` plus
a fresh execution instead of the timeout.  The
driver wakes the core at a start's `hedge_at` (`hedge(state, at)`); every other input hedges too.

Each sample's deadline is decided here once, at its first start (`at + T`), and every copy of it
carries that deadline (`StartScoring.deadline`).  The core cuts a scoring at its deadline plus
`state.grace`: how late the driver's reward executor may start a job that it times out from its own
start (`set_grace`; 0 unless told), so a scoring that waited in the executor for a worker is never
cut before the executor's own timeout.

Pure: `(state, input) -> (state, outputs)`, where outputs are `StartScoring` commands for the driver
and `RewardScored` events for the core's Scheduler.  Time is an input (`at`); the driver calls
`expire(state, at)` when the clock passes `state.next_expiry`.
"""

from __future__ import annotations

import attrs
from attrs import field, frozen
from attrs.validators import optional
from immutables import Map

from .commands import StartScoring
from .errors import ConfigError, SchedulerMisuse
from .events import RewardScored
from .records import request_number
from .validators import non_negative, positive, positive_number


@frozen(kw_only=True)
class RewardConfig:
    workers: int = field(default=64, validator=positive_number)
    """Samples scored at once (sandbox / verifier processes)."""
    t_min: float = field(default=2.0, validator=positive_number)
    scale: float = field(default=1.5, validator=positive_number)
    """lambda: the timeout is this multiple of the slowest correct execution."""
    t_max: float = field(default=30.0, validator=positive_number)
    hedge_after: float | None = field(default=2.0, validator=optional(positive_number))
    """Seconds an execution runs before a free worker starts a second copy of it (first answer
    wins); None: never (a hang is waited out to its deadline)."""
    hedge_copies: int = field(default=1, validator=positive)
    """Most copies of one sample besides its first execution: copy k starts `hedge_after` after
    copy k - 1 did, while none has answered."""
    priority: bool = True
    """Samples of complete groups are scored before those of open groups (False: arrival order)."""
    burst_workers: int = field(default=0, validator=non_negative)
    """Executions allowed beyond `workers` for the samples the step waits for (complete groups',
    with `priority`) and for hedges: a pool sized to the burst at the round's end, whose extra
    workers score nothing of a group still open."""

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
    """The oldest ticket that may still wait (tickets below it have started)."""
    tail: int = 0
    tickets: Map = field(factory=Map)
    """request number -> its ticket, while it waits."""
    first: tuple[int, ...] = ()
    """Tickets of waiting samples of complete groups, in promotion order: they start first."""
    running: Map = field(factory=Map)
    """request number -> (request id, deadline, start time of each copy)."""
    grace: float = 0.0
    """Seconds past a deadline before the core cuts the scoring: how late the reward executor may
    start a job it times out from its own start (`RewardScheduler.set_grace`)."""
    busy: int = 0
    """Executions running (a hedged sample counts twice)."""
    anchor: float | None = None
    """Slowest correct execution so far (T_anchor)."""
    scored: int = 0
    timeouts: int = 0
    failures: int = 0
    hedges: int = 0

    def expiry(self, deadline: float) -> float:
        """When the core cuts a scoring with this deadline: `grace` past it."""
        return deadline + self.grace

    @property
    def next_expiry(self) -> float | None:
        """When the core next cuts a running scoring (None: none runs)."""
        deadlines = [d for _, (_, d, _) in self.running.items()]
        return self.expiry(min(deadlines)) if deadlines else None

    @property
    def num_waiting(self) -> int:
        return len(self.queue)


class RewardScheduler:
    def __init__(self, config: RewardConfig | None = None) -> None:
        self.config = config or RewardConfig()

    def initial(self) -> RewardState:
        return RewardState()

    def submit(self, state: RewardState, request_id: str, at: float, first: bool = False) -> tuple[RewardState, list]:
        """Queue a sample; `first`: its group is complete (with `priority`, it goes before open groups')."""
        number = request_number(request_id)
        if number in state.running or number in state.tickets:
            raise SchedulerMisuse(f"reward scheduler: {request_id} submitted twice")
        state = attrs.evolve(state, queue=state.queue.set(state.tail, (request_id, at)),
                             tickets=state.tickets.set(number, state.tail), tail=state.tail + 1)
        if first:
            state = self.promote(state, [request_id])
        return self._start(state, at, [])

    def promote(self, state: RewardState, request_ids) -> RewardState:
        """The samples' group is complete: those still waiting start before any open group's."""
        if not self.config.priority:
            return state
        tickets = sorted(state.tickets[n] for n in map(request_number, request_ids) if n in state.tickets)
        return attrs.evolve(state, first=state.first + tuple(tickets))

    def finished(self, state: RewardState, request_id: str, reward: float, correct: bool, at: float,
                 failed: bool = False, seconds: float | None = None) -> tuple[RewardState, list]:
        """The scorer of `request_id` (any copy) answered at `at`, having run `seconds` (a driver
        that measured it; else, or when the sample was hedged, the time since its first copy started:
        T_anchor then counts the wait the deadline bounds, not the winning copy's run alone).  The
        first answer is the sample's; a later one (another copy's, or after the timeout) is ignored."""
        number = request_number(request_id)
        entry = state.running.get(number)
        if entry is None:
            return state, []
        _, _, starts = entry
        anchor = state.anchor
        if correct and not failed:  # (hedged: the sample's time since its first start, what its deadline bounds)
            anchor = max(anchor or 0.0, at - starts[0] if seconds is None or len(starts) > 1 else seconds)
        state = attrs.evolve(state, running=state.running.delete(number), busy=state.busy - len(starts),
                             anchor=anchor, scored=state.scored + 1, failures=state.failures + int(failed))
        out: list = [RewardScored(request_id, 0.0 if failed else reward, failed, at)]
        return self._start(state, at, out)

    def set_grace(self, state: RewardState, seconds: float) -> RewardState:
        """The reward executor may start a job up to `seconds` after its StartScoring and times it
        out from that start: the core cuts a scoring only `seconds` past its deadline."""
        if not seconds >= 0:
            raise SchedulerMisuse(f"reward scheduler: start grace must be >= 0, got {seconds}")
        return attrs.evolve(state, grace=float(seconds))

    def expire(self, state: RewardState, at: float) -> tuple[RewardState, list]:
        """At `at`, time out every running sample whose expiry (its deadline plus `state.grace`) is
        <= `at`, both copies of a hedged one."""
        out: list = []
        running, busy = state.running, state.busy
        for number, (rid, deadline, starts) in sorted(state.running.items()):
            if state.expiry(deadline) <= at:
                running = running.delete(number)
                busy -= len(starts)
                out.append(RewardScored(rid, 0.0, True, at))
        if out:
            state = attrs.evolve(state, running=running, busy=busy, timeouts=state.timeouts + len(out),
                                 scored=state.scored + len(out))
        return self._start(state, at, out)

    def hedge(self, state: RewardState, at: float) -> tuple[RewardState, list]:
        """The clock reached `next_hedge`: start the copies that are due on free workers."""
        return self._start(state, at, [])

    def _start(self, state: RewardState, at: float, out: list) -> tuple[RewardState, list]:
        """Give free workers to waiting samples (complete groups' first, then arrival order), then
        to second copies of executions running `hedge_after` or longer (the oldest first)."""
        queue, head, first, tickets, running = state.queue, state.head, state.first, state.tickets, state.running
        busy = state.busy
        timeout = self.config.timeout(state.anchor)
        while queue:
            while first and first[0] not in queue:  # (promoted, then started from the head)
                first = first[1:]
            if busy >= self.config.workers + (self.config.burst_workers if first else 0):
                break
            if first:
                ticket, first = first[0], first[1:]
            else:
                while head not in queue:
                    head += 1
                ticket = head
            rid, arrived = queue[ticket]
            queue = queue.delete(ticket)
            number = request_number(rid)
            tickets = tickets.delete(number)
            deadline = at + timeout
            running = running.set(number, (rid, deadline, (at,)))
            busy += 1
            out.append(StartScoring(rid, deadline, at, at - arrived, hedge_at=self._hedge_at(at, deadline)))
        state = attrs.evolve(state, queue=queue, head=head, first=first if queue else (), tickets=tickets,
                             running=running, busy=busy)
        return self._hedge(state, at, out)

    def _hedge_at(self, at: float, deadline: float, copy: int = 0) -> float | None:
        """When the execution started now (its `copy`) may get the next copy; None: it may not."""
        after = self.config.hedge_after
        if after is None or copy >= self.config.hedge_copies or at + after >= deadline:
            return None
        return at + after

    def _hedge(self, state: RewardState, at: float, out: list) -> tuple[RewardState, list]:
        after, limit = self.config.hedge_after, self.config.workers + self.config.burst_workers
        if after is None or state.first or state.busy >= limit:  # (first: the step's samples wait)
            return state, out
        due = sorted((starts[-1], number) for number, (_, d, starts) in state.running.items()
                     if len(starts) <= self.config.hedge_copies and starts[-1] + after <= at < d)
        running, busy = state.running, state.busy
        for _, number in due[: limit - busy]:
            rid, deadline, starts = running[number]
            running = running.set(number, (rid, deadline, (*starts, at)))
            busy += 1
            out.append(StartScoring(rid, deadline, at, 0.0, copy=len(starts),
                                    hedge_at=self._hedge_at(at, deadline, len(starts))))
        return attrs.evolve(state, running=running, busy=busy, hedges=state.hedges + busy - state.busy), out
