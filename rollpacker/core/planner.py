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
state taken apart into typed mutable fields (core/draft.py), frozen back into a `PlannerState` once per event.

Every prompt is trained exactly once per epoch because a key leaves the pool's in-flight set only
by `complete` (trained), `defer` or `release` (drawn again later), and the planner completes
exactly the prompts whose groups it reports as trained.
"""

from __future__ import annotations

from immutables import Map

from .commands import Command, EndRound, RoundReport
from .draft import Draft, group_tokens
from .errors import ConfigError, SchedulerMisuse
from .events import Event, RequestAborted, RequestFinished, TokensGenerated
from .policy import Policy
from .prompt_pool import PromptPool
from .records import replace, request_number
from .round_state import Group, PlannerState, RoundState, Tally, cons_iter
from .states import transition


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
        transition(rnd.phase, EndRound, f"of step {rnd.step}")
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
