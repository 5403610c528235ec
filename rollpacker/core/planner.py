"""Round planner: one set of transitions, policies as small strategy objects.

Theory of operation
-------------------
A step is a round of rollout followed by one optimizer step.  `begin_round` asks the policy which
groups (a prompt and the samples to launch for it) this round plays and how many must complete
(`target`, always P); it launches them, all at once or up to the policy's `capacity`.  `handle`
takes one engine event:

    RequestFinished  the sample joins its group's `kept` (ScoreSample).  When a group holds R
                     samples it is complete (CloseGroup) and its other requests are aborted.
                     When `target` groups are complete the round closes: every running request is
                     aborted.
    RequestAborted   ours: the tokens are wasted, or kept as a resume prefix if the policy carries
                     unfinished work.  Not ours (engine failure): the sample is relaunched.

The round ends when it is closing and no request is outstanding: completed groups are trained
(pool: completed), incomplete ones go where the policy says (deferred, returned, carried) and
`EndRound` reports the round's accounting.  A request is in the round's tables until its answer
arrives, so a late answer is recognised.  A request we aborted is never scored in its round: its
late finish is wasted, or, by a policy that carries unfinished work, kept unscored in its carried
group and scored when that group completes (a sample that goes stale first is never scored).

Every state a transition changes (request, group, round) is an enum of states.py and moves only
through `transition`, which refuses a move its table lacks.  A transition works on a `Draft`, the
state taken apart into typed mutable fields, frozen back into a `PlannerState` once per event.

Every prompt is trained exactly once per epoch because a key leaves the pool's in-flight set only
by `complete` (trained), `defer` or `release` (drawn again later), and the planner completes
exactly the prompts whose groups it reports as trained.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from attrs import define, field
from immutables import Map

from .commands import (
    AbortRequest,
    CloseGroup,
    Command,
    EndRound,
    LaunchRequest,
    RoundReport,
    ScoreSample,
)
from .errors import ConfigError, SchedulerMisuse
from .events import Event, RequestAborted, RequestFinished, TokensGenerated
from .prompt_pool import PromptPool
from .records import Sample, Segment, replace, request_id, request_number, sampling_seed
from .round_state import Cons, Group, PlannerState, RequestRecord, RoundState, Tally, cons_iter
from .states import GroupState, RequestState, RoundPhase, transition


class Policy(Protocol):
    """What a planner policy decides; the transitions themselves live in `RoundPlanner`."""

    name: str
    prompts: int
    samples: int
    max_tokens: int
    capacity: int | None
    """Most requests running at once (None: launch the whole round at once)."""
    carries: bool
    """Unfinished work (kept samples, partial responses) is carried to the next round."""
    max_staleness: int
    """Most policy versions a trained token may lag (0: strictly on-policy)."""

    def open_round(self, state: PlannerState) -> tuple[PlannerState, str, list[Group]]:
        """Draw this round's groups (with `pending` launches) from the pool; return the new state
        and the round kind."""

    def close_round(self, state: PlannerState, kind: str, incomplete: list[Group]) -> PlannerState:
        """Put the prompts of groups that did not complete where they belong."""

    def defer_point(self, kind: str, target: int) -> int | None:
        """Completed groups at which `to_defer` is asked, once per round (None: never)."""

    def to_defer(self, live: list[tuple[int, Group]], need: int, history, clock: int) -> tuple[int, ...]:
        """Slots of live groups to abort now and leave incomplete (close_round places them)."""


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
        state = transition(group.state, GroupState.COMPLETE, group.prompt)
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
            state = transition(group.state, GroupState.DEFERRED, group.prompt)
            self.groups = self.groups.set(slot, replace(group, state=state, pending=()))
            self.queue = tuple(s for s in self.queue if s != slot)

    def close(self) -> None:
        self.phase = transition(self.phase, RoundPhase.CLOSING, f"of step {self.round.step}")
        self.queue = ()
        self.abort_requests(sorted(self.requests.keys()))

    def abort_requests(self, numbers: Iterable[int]) -> None:
        for number in numbers:
            record = self.requests[number]
            if record.state is RequestState.RUNNING:
                state = transition(record.state, RequestState.ABORTING, number)
                self.requests = self.requests.set(number, replace(record, state=state))
                self.commands.append(AbortRequest(request_id(number)))

    def request_ended(self, number: int, record: RequestRecord, num_tokens: int, finished: bool,
                      outcome: RequestState) -> tuple[Group, frozenset[int]]:
        """Bookkeeping shared by finish and abort: the request's last move, drop the record, log the
        length; the group and its running set without this request (the caller writes the group
        back once)."""
        transition(record.state, outcome, number)
        self.requests = self.requests.delete(number)
        total = segments_tokens(record.resume) + num_tokens if record.resume else num_tokens
        self.observations = ((record.prompt.index, total, finished, num_tokens), self.observations)
        group = self.groups[record.slot]
        return group, group.running - {number}

    def finished(self, number: int, record: RequestRecord, event: RequestFinished) -> None:
        running_before = record.state is RequestState.RUNNING
        outcome = RequestState.FINISHED if running_before else RequestState.ABORTED
        group, running = self.request_ended(number, record, event.num_tokens, event.finish_reason == "stop", outcome)
        segment = Segment(event.request_id, event.num_tokens, record.policy_version)
        sample = Sample(event.request_id, record.prompt, record.sample_index, record.resume + (segment,), event.finish_reason)
        if group.is_complete or (not running_before and not self.policy.carries):
            self.wasted += sample.num_tokens
            group = replace(group, running=running)
        else:
            group = self.keep(record.slot, group, sample, running, score=running_before)
        self.groups = self.groups.set(record.slot, group)

    def aborted(self, number: int, record: RequestRecord, event: RequestAborted) -> None:
        ours = record.state is RequestState.ABORTING
        outcome = RequestState.ABORTED if ours else RequestState.DROPPED
        group, running = self.request_ended(number, record, event.num_tokens, False, outcome)
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


class RoundPlanner:
    """The transitions of every policy: `(state, event) -> (state, commands)`.

    The planner object holds only the (immutable) policy; all state is in `PlannerState`.
    """

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def initial(self, num_prompts: int, seed: int = 0, epochs: int | None = None) -> PlannerState:
        if self.policy.prompts > num_prompts:
            raise ConfigError(
                f"prompts (P={self.policy.prompts}) is larger than the dataset ({num_prompts} prompts)"
            )
        return PlannerState(pool=PromptPool(num_prompts=num_prompts, seed=seed, epochs=epochs))

    # -- rounds ----------------------------------------------------------------------------------

    def begin_round(self, state: PlannerState) -> tuple[PlannerState, list[Command]]:
        if state.round is not None:
            raise SchedulerMisuse(f"begin_round: round of step {state.round.step} is still open")
        state, kind, groups = self.policy.open_round(state)
        if not groups:
            raise SchedulerMisuse(f"begin_round: nothing to launch, the pool's {state.pool.epochs} epoch(s) are all "
                                  f"drawn and trained")
        carried_in = sum(group_tokens(g) for g in groups)
        groups = [self._drop_stale(g, state.step) for g in groups]
        wasted = carried_in - sum(group_tokens(g) for g in groups)
        table = Map(dict(enumerate(groups)))
        target = min(self.policy.prompts, len(groups))
        queue = tuple(slot for slot, g in enumerate(groups) if g.pending)
        tally = Tally(carried_in=carried_in, wasted=wasted)
        rnd = RoundState(kind, state.step, target, groups=table, num_groups=len(groups), queue=queue, tally=tally)
        txn = Draft.of(self.policy, replace(state, round=rnd, carried=()))
        for slot, group in enumerate(groups):  # a carried group may already hold R samples
            if len(group.kept) >= self.policy.samples:
                txn.groups = txn.groups.set(slot, txn.complete_group(slot, group))
        txn.launch_pending()
        return self._maybe_end(txn)

    def _drop_stale(self, group: Group, step: int) -> Group:
        """Carried work older than the staleness bound is dropped; its samples start again."""
        bound = self.policy.max_staleness
        kept = tuple(s for s in group.kept if s.staleness(step) <= bound)
        unscored = tuple(s for s in group.unscored if s.staleness(step) <= bound)
        restarts = tuple((s.sample_index, ()) for s in group.kept if s.staleness(step) > bound)
        pending = tuple(
            (index, prefix if not prefix or step - min(p.policy_version for p in prefix) <= bound else ())
            for index, prefix in group.pending
        )
        return replace(group, kept=kept, unscored=unscored, pending=pending + restarts)

    def handle(self, state: PlannerState, event: Event) -> tuple[PlannerState, list[Command]]:
        if not isinstance(event, (RequestFinished, RequestAborted, TokensGenerated)):
            return state, []  # rewards are the stream batcher's business
        number = request_number(event.request_id)
        record = state.requests.get(number)
        if record is None:
            raise SchedulerMisuse(
                f"can't handle {type(event).__name__}: request={event.request_id} is not running "
                f"(never launched, or already finished or aborted)"
            )
        if isinstance(event, TokensGenerated):
            return state, []
        txn = Draft.of(self.policy, state)
        if isinstance(event, RequestFinished):
            txn.finished(number, record, event)
        else:
            txn.aborted(number, record, event)
        if not txn.is_closing:
            txn.launch_pending()
        return self._maybe_end(txn)

    def _maybe_end(self, txn: Draft) -> tuple[PlannerState, list[Command]]:
        state = txn.freeze()
        if not (txn.is_closing and len(state.requests) == 0):
            return state, txn.commands
        return self._end_round(state, txn.commands)

    def _end_round(self, state: PlannerState, commands: list[Command]) -> tuple[PlannerState, list[Command]]:
        rnd = state.round
        transition(rnd.phase, RoundPhase.ENDED, f"of step {rnd.step}")
        groups = [rnd.groups[slot] for slot in range(rnd.num_groups)]
        trained = [g for g in groups if g.is_complete]
        incomplete = [g for g in groups if not g.is_complete]
        held = sum(group_tokens(g) for g in incomplete)
        carried_out = held if self.policy.carries else 0
        pool = state.pool.complete(g.prompt for g in trained)
        observations = list(cons_iter(rnd.observations))
        tally = rnd.tally
        if observations:
            indices, lengths, finished, generated = zip(*observations)
            pool = pool.record_lengths(indices, lengths, finished)
            tally = replace(tally, generated=sum(generated), ended_requests=len(lengths), ended_tokens=sum(lengths))
        wasted = tally.wasted + (0 if self.policy.carries else held)
        state = replace(state, pool=pool)
        state = self.policy.close_round(state, rnd.kind, incomplete)
        if self.policy.carries:
            state = replace(state, carried=tuple(incomplete))
        report = _report(rnd, trained, tally, wasted, carried_out, len(incomplete), self.policy.carries)
        carried_ids = tuple(
            sorted({seg.request_id for g in state.carried for s in g.kept for seg in s.segments}
                   | {seg.request_id for g in state.carried for _, p in g.pending for seg in p})
        )
        commands.append(EndRound(rnd.step, rnd.kind, tuple(g.prompt for g in trained), report, carried_ids))
        return replace(state, round=None, step=state.step + 1), commands

    # -- checkpoints -----------------------------------------------------------------------------

    def to_dict(self, state: PlannerState) -> dict:
        """Checkpoint: the pool, the step and the request counter (ids are never reused)."""
        return {"policy": self.policy.name, "step": state.step, "next_request": state.next_request,
                "pool": state.pool.to_dict()}

    def from_dict(self, data: dict) -> PlannerState:
        """Restore after a restart: work that was in flight (or carried, or loaded) is drawn again,
        so nothing is lost and nothing is trained twice."""
        if data.get("policy") != self.policy.name:
            raise ConfigError(f"checkpoint was written by policy {data.get('policy')!r}, not {self.policy.name!r}")
        pool = PromptPool.from_dict(data["pool"]).recover()
        return PlannerState(pool=pool, step=int(data["step"]), next_request=int(data["next_request"]))


def _report(rnd: RoundState, trained: list[Group], tally: Tally, wasted: int, carried_out: int,
            num_incomplete: int, carries: bool) -> RoundReport:
    samples = [s for g in trained for s in g.kept]
    lag_tokens: dict[int, int] = {}
    for sample in samples:
        for seg in sample.segments:
            lag = rnd.step - seg.policy_version
            lag_tokens[lag] = lag_tokens.get(lag, 0) + seg.num_tokens
    kept = sum(s.num_tokens for s in samples)
    return RoundReport(
        step=rnd.step,
        kind=rnd.kind,
        launched_requests=tally.launched,
        generated_tokens=tally.generated,
        kept_tokens=kept,
        wasted_tokens=wasted,
        carried_tokens=carried_out,
        offpolicy_tokens=sum(n for lag, n in lag_tokens.items() if lag > 0),
        staleness=tuple(sorted(lag_tokens.items())),
        trained_prompts=len(trained),
        deferred_prompts=num_incomplete if rnd.kind == "short" else 0,
        returned_prompts=0 if carries or rnd.kind == "short" else num_incomplete,
        mean_kept_length=kept / len(samples) if samples else 0.0,
        mean_generated_length=tally.ended_tokens / tally.ended_requests if tally.ended_requests else 0.0,
        retried_requests=tally.retried,
    )
