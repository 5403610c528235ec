"""The states of the core's state machines, and every move between them, as data (h11's `_state.py`).

Rule: everything about which state may follow which lives in this file.  A component keeps its
state as one of these enums and changes it only through `transition(current, trigger, subject)`,
which looks the next state up in `TRANSITIONS`, keyed by (state, trigger): the caller says what
happened, never which state follows.  A trigger the table lacks for the state raises
`SchedulerMisuse` naming the subject.

RequestState (planner.py: one launched request of a round)

    RUNNING --RequestFinished--> FINISHED      its sample is kept (scored) unless its group is done
    RUNNING --AbortRequest-----> ABORTING      we asked the engine to stop it
    RUNNING --RequestAborted---> DROPPED       the engine dropped it: the sample is launched again
    ABORTING --RequestFinished-> ABORTED       a late finish: never scored (wasted, or carried
    ABORTING --RequestAborted--> ABORTED         unscored by a policy that carries unfinished work)

GroupState (planner.py: one prompt's samples within a round)

    OPEN --CloseGroup--> COMPLETE    R samples kept: trained this step
    OPEN --DEFER-------> DEFERRED    the policy's to_defer: its requests aborted, left incomplete
    (an OPEN or DEFERRED group at the round's end goes where the policy says: carried, deferred,
    returned)

RoundPhase (planner.py: the rollout part of a step)

    OPEN --CLOSE------> CLOSING   the target groups are complete: every running request is aborted
    CLOSING --EndRound--> ENDED   no request left

PromptStatus (prompt_pool.py: one prompt of one epoch; derived from the pool, never stored)

    FRESH --TAKE--> IN_FLIGHT --COMPLETE--> COMPLETED (trained)
    IN_FLIGHT --DEFER--> DEFERRED --TAKE--> IN_FLIGHT
    IN_FLIGHT --RELEASE--> FRESH   (release, recover)

RewardStatus (stream_batcher.py: one kept sample's reward)

    AWAITING --RewardScored---> SCORED
    AWAITING --StepOptimizer--> DISCARDED  the step ended without its group (a late reward is expected)
    DISCARDED --RewardScored--> DROPPED    the late reward is ignored; the entry goes
"""

from __future__ import annotations

import enum

from .commands import AbortRequest, CloseGroup, EndRound, StepOptimizer
from .errors import SchedulerMisuse
from .events import RequestAborted, RequestFinished, RewardScored
from .records import request_id


class RequestState(enum.Enum):
    RUNNING = "running"
    ABORTING = "aborting"
    FINISHED = "finished"
    ABORTED = "aborted"
    DROPPED = "dropped"


class GroupState(enum.Enum):
    OPEN = "open"
    COMPLETE = "complete"
    DEFERRED = "deferred"


class RoundPhase(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"
    ENDED = "ended"


class PromptStatus(enum.Enum):
    FRESH = "fresh"
    IN_FLIGHT = "in flight"
    DEFERRED = "deferred"
    COMPLETED = "completed"


class RewardStatus(enum.Enum):
    AWAITING = "awaiting"
    SCORED = "scored"
    DISCARDED = "discarded"
    DROPPED = "dropped"


class Move(enum.Enum):
    """The triggers of the table that are not one of the core's events or commands."""

    DEFER = "defer"
    """A policy defers it: a group predicted long (its requests aborted), a prompt to the long queue."""
    CLOSE = "close"
    """The round's target groups are complete: every running request is aborted."""
    TAKE = "take"
    """The pool hands the prompt to a round (a fresh draw, or the long queue's)."""
    RELEASE = "release"
    """The prompt goes back to the pool undrawn (a draw that filled the long queue; a restart's recovery)."""
    COMPLETE = "complete"
    """The prompt's group was trained."""


Trigger = type | Move
"""What moves a machine: an event or command class of the core, or a `Move`."""

TRANSITIONS: dict[tuple[enum.Enum, Trigger], enum.Enum] = {
    (RequestState.RUNNING, RequestFinished): RequestState.FINISHED,
    (RequestState.RUNNING, AbortRequest): RequestState.ABORTING,
    (RequestState.RUNNING, RequestAborted): RequestState.DROPPED,
    (RequestState.ABORTING, RequestFinished): RequestState.ABORTED,
    (RequestState.ABORTING, RequestAborted): RequestState.ABORTED,
    (GroupState.OPEN, CloseGroup): GroupState.COMPLETE,
    (GroupState.OPEN, Move.DEFER): GroupState.DEFERRED,
    (RoundPhase.OPEN, Move.CLOSE): RoundPhase.CLOSING,
    (RoundPhase.CLOSING, EndRound): RoundPhase.ENDED,
    (PromptStatus.FRESH, Move.TAKE): PromptStatus.IN_FLIGHT,
    (PromptStatus.IN_FLIGHT, Move.DEFER): PromptStatus.DEFERRED,
    (PromptStatus.IN_FLIGHT, Move.RELEASE): PromptStatus.FRESH,
    (PromptStatus.IN_FLIGHT, Move.COMPLETE): PromptStatus.COMPLETED,
    (PromptStatus.DEFERRED, Move.TAKE): PromptStatus.IN_FLIGHT,
    (RewardStatus.AWAITING, RewardScored): RewardStatus.SCORED,
    (RewardStatus.AWAITING, StepOptimizer): RewardStatus.DISCARDED,
    (RewardStatus.DISCARDED, RewardScored): RewardStatus.DROPPED,
}
"""(state, trigger) -> the state it moves to: every move any machine makes, and nothing else.  A
final state is one that starts no edge."""

INITIAL = (RequestState.RUNNING, GroupState.OPEN, RoundPhase.OPEN, PromptStatus.FRESH, RewardStatus.AWAITING)
"""The state each machine starts in."""

_EDGES: dict[enum.Enum, dict[Trigger, enum.Enum]] = {}
for (_state, _trigger), _new in TRANSITIONS.items():
    _EDGES.setdefault(_state, {})[_trigger] = _new


def transition(current: enum.Enum, trigger: Trigger, subject: object) -> enum.Enum:
    """The state `trigger` moves `current` to, looked up in the table; `SchedulerMisuse` naming
    `subject` (a request number, a prompt key, a step), the state and the trigger when the table has
    no such edge."""
    new = _EDGES.get(current, {}).get(trigger)
    if new is not None:
        return new
    if type(current) is RequestState and type(subject) is int:
        subject = request_id(subject)
    allowed = ", ".join(sorted(_name(t) for t in _EDGES.get(current, {}))) or "none: it is final"
    raise SchedulerMisuse(f"can't move {_NOUNS[type(current)]} {subject} from {current.name} on {_name(trigger)} "
                          f"(allowed from {current.name}: {allowed})")


def _name(trigger: Trigger) -> str:
    return trigger.name if isinstance(trigger, Move) else trigger.__name__


_NOUNS = {RequestState: "request", GroupState: "group", RoundPhase: "round", PromptStatus: "prompt",
          RewardStatus: "reward of"}
