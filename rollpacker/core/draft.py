"""The planner's working copy of one transition (`Draft`): the planner's state taken apart into typed
mutable fields, changed by one event (or a round's opening) through the transition table, then
frozen back into the next immutable `PlannerState` (core/planner.py: `RoundPlanner`)."""

from __future__ import annotations

from collections.abc import Iterable

from attrs import define, field
from immutables import Map

from .commands import AbortRequest, CloseGroup, Command, LaunchRequest, ScoreSample
from .events import Event, RequestAborted, RequestFinished
from .policy import Policy
from .records import Sample, Segment, replace, request_id, sampling_seed
from .round_state import Cons, Group, PlannerState, RequestRecord, RoundState, cons_iter
from .states import GroupState, Move, RequestState, RoundPhase, transition


def segments_tokens(segments: Iterable[Segment]) -> int:
    return sum(s.num_tokens for s in segments)


def group_tokens(group: Group) -> int:
    """Tokens held by a group between rounds: kept samples and resume prefixes."""
    return sum(s.num_tokens for s in group.kept) + sum(segments_tokens(p) for _, p in group.pending)


@define
class Draft:
    """The mutable working copy of one transition (one event, or a round's opening): the planner's
    state taken apart into the fields a transition changes; `freeze` builds the next immutable
    state from it."""

    policy: Policy
    state: PlannerState
    requests: Map
    """request number -> RequestRecord of every request still running."""
    round: RoundState
    groups: Map
    """slot -> Group of the round."""
    queue: tuple[int, ...]
    next_request: int
    phase: RoundPhase
    num_completed: int
    observations: Cons
    commands: list[Command] = field(factory=list)
    launched: int = 0
    """Tally changes of this transition (added to the round's tally by `freeze`)."""
    wasted: int = 0
    retried: int = 0

    @classmethod
    def of(cls, policy: Policy, state: PlannerState) -> Draft:
        rnd = state.round
        return cls(policy, state, state.requests, rnd, rnd.groups, rnd.queue, state.next_request, rnd.phase,
                   rnd.num_completed, rnd.observations)

    def freeze(self) -> PlannerState:
        tally = self.round.tally
        if self.launched or self.wasted or self.retried:
            tally = replace(tally, launched=tally.launched + self.launched, wasted=tally.wasted + self.wasted,
                            retried=tally.retried + self.retried)
        rnd = replace(self.round, groups=self.groups, tally=tally, queue=self.queue, phase=self.phase,
                      num_completed=self.num_completed, observations=self.observations)
        return replace(self.state, requests=self.requests, round=rnd, next_request=self.next_request)

    @property
    def is_closing(self) -> bool:
        return self.phase is RoundPhase.CLOSING

    # -- launching -------------------------------------------------------------------------------

    def launch_pending(self) -> None:
        if not self.queue:
            return
        capacity = self.policy.capacity
        step = self.round.step
        launched = 0
        while self.queue:
            room = len(self.groups[self.queue[0]].pending) if capacity is None else capacity - len(self.requests)
            if room <= 0:
                break
            slot = self.queue[0]
            group = self.groups[slot]
            batch, rest = group.pending[:room], group.pending[room:]
            numbers = range(self.next_request, self.next_request + len(batch))
            self.next_request += len(batch)
            for number, (index, prefix) in zip(numbers, batch):
                self.requests = self.requests.set(number, RequestRecord(group.prompt, slot, index, prefix, step))
                max_new = self.policy.max_tokens - segments_tokens(prefix)
                seed = sampling_seed(self.state.pool.seed, number)
                self.commands.append(LaunchRequest(request_id(number), group.prompt, index, max_new, step, seed, prefix))
            self.groups = self.groups.set(slot, replace(group, pending=rest, running=group.running.union(numbers)))
            if not rest:
                self.queue = self.queue[1:]
            launched += len(batch)
        self.launched += launched

    # -- request outcomes ------------------------------------------------------------------------

    def keep(self, slot: int, group: Group, sample: Sample, running: frozenset[int], score: bool) -> Group:
        """Add a finished sample to its group (with the group's new running set).  `score` is False
        for the late finish of a request we aborted: it is kept unscored (the group is carried)."""
        if len(group.kept) >= self.policy.samples:  # a late answer to a group already full
            self.wasted += sample.num_tokens
            return replace(group, running=running)
        if not score:  # (only while the round closes: the group cannot complete now)
            return replace(group, kept=group.kept + (sample,), unscored=group.unscored + (sample,), running=running)
        group = replace(group, kept=group.kept + (sample,), running=running)
        self.commands.append(ScoreSample(sample))
        if len(group.kept) == self.policy.samples and group.state is GroupState.OPEN and not self.is_closing:
            group = self.complete_group(slot, group)  # (a full group found while closing is carried)
        return group

    def complete_group(self, slot: int, group: Group) -> Group:
        self.commands.extend(ScoreSample(s) for s in group.unscored)
        self.commands.append(CloseGroup(group.prompt, group.kept))
        self.abort_requests(group.running)
        state = transition(group.state, CloseGroup, group.prompt)
        group = replace(group, state=state, pending=(), unscored=())
        if slot in self.queue:
            self.queue = tuple(s for s in self.queue if s != slot)
        self.num_completed += 1
        if self.num_completed == self.round.target:
            self.close()
        elif self.num_completed == self.policy.defer_point(self.round.kind, self.round.target):
            self.defer_live_groups(slot, self.round.target - self.num_completed)
        return group

    def defer_live_groups(self, done_slot: int, need: int) -> None:
        """Abort the groups the policy predicts long; they stay incomplete, so the round's end hands
        them to `close_round` like any group still running at the close."""
        live = [(s, g) for s, g in sorted(self.groups.items())
                if s != done_slot and g.state is GroupState.OPEN and (g.running or g.pending)]
        clock = max((n for _, n, finished, _ in cons_iter(self.observations) if finished), default=0)
        for slot in self.policy.to_defer(live, need, self.state.pool.history, clock):
            group = self.groups[slot]
            self.abort_requests(group.running)
            state = transition(group.state, Move.DEFER, group.prompt)
            self.groups = self.groups.set(slot, replace(group, state=state, pending=()))
            self.queue = tuple(s for s in self.queue if s != slot)

    def close(self) -> None:
        self.phase = transition(self.phase, Move.CLOSE, f"of step {self.round.step}")
        self.queue = ()
        self.abort_requests(sorted(self.requests.keys()))

    def abort_requests(self, numbers: Iterable[int]) -> None:
        for number in numbers:
            record = self.requests[number]
            if record.state is RequestState.RUNNING:
                state = transition(record.state, AbortRequest, number)
                self.requests = self.requests.set(number, replace(record, state=state))
                self.commands.append(AbortRequest(request_id(number)))

    def request_ended(self, number: int, record: RequestRecord, num_tokens: int, finished: bool,
                      event: type[Event]) -> tuple[RequestState, Group, frozenset[int]]:
        """Bookkeeping shared by finish and abort: the request's last move (its final state, looked
        up in the table), drop the record, log the length; the final state, the group and its
        running set without this request (the caller writes the group back once)."""
        outcome = transition(record.state, event, number)
        self.requests = self.requests.delete(number)
        total = segments_tokens(record.resume) + num_tokens if record.resume else num_tokens
        self.observations = ((record.prompt.index, total, finished, num_tokens), self.observations)
        group = self.groups[record.slot]
        return outcome, group, group.running - {number}

    def finished(self, number: int, record: RequestRecord, event: RequestFinished) -> None:
        outcome, group, running = self.request_ended(number, record, event.num_tokens, event.finish_reason == "stop",
                                                     RequestFinished)
        running_before = outcome is RequestState.FINISHED  # (else ABORTED: it finished after our abort)
        segment = Segment(event.request_id, event.num_tokens, record.policy_version)
        sample = Sample(event.request_id, record.prompt, record.sample_index, record.resume + (segment,), event.finish_reason)
        if group.is_complete or (not running_before and not self.policy.carries):
            self.wasted += sample.num_tokens
            group = replace(group, running=running)
        else:
            group = self.keep(record.slot, group, sample, running, score=running_before)
        self.groups = self.groups.set(record.slot, group)

    def aborted(self, number: int, record: RequestRecord, event: RequestAborted) -> None:
        outcome, group, running = self.request_ended(number, record, event.num_tokens, False, RequestAborted)
        ours = outcome is RequestState.ABORTED  # (else DROPPED: the engine dropped it, not we)
        prefix = record.resume + ((Segment(event.request_id, event.num_tokens, record.policy_version),) if event.num_tokens else ())
        if not ours:  # the engine dropped it: relaunch the same sample from its old prefix
            self.wasted += event.num_tokens
            self.retried += 1
            group = replace(group, pending=((record.sample_index, record.resume),) + group.pending, running=running)
            self.queue = (record.slot,) + tuple(s for s in self.queue if s != record.slot)
        elif group.is_complete or not self.policy.carries:
            self.wasted += segments_tokens(prefix)
            group = replace(group, running=running)
        elif segments_tokens(prefix) >= self.policy.max_tokens:  # it had reached the cap: finished
            sample = Sample(event.request_id, record.prompt, record.sample_index, prefix, "length")
            group = self.keep(record.slot, group, sample, running, score=False)
        else:
            group = replace(group, pending=group.pending + ((record.sample_index, prefix),), running=running)
        self.groups = self.groups.set(record.slot, group)
