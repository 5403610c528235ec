"""The states of the core's state machines, and every move between them, as data (h11's `_state.py`).

Rule: everything about which state may follow which lives in this file.  A component keeps its
state as one of these enums and changes it only through `transition(current, new, subject)`, which
raises `SchedulerMisuse` naming the subject when the move is not in `TRANSITIONS`.

RequestState (planner.py: one launched request of a round)

    RUNNING --RequestFinished--> FINISHED      its sample is kept (scored) unless its group is done
    RUNNING --AbortRequest-----> ABORTING      we asked the engine to stop it
    RUNNING --RequestAborted---> DROPPED       the engine dropped it: the sample is launched again
    ABORTING --RequestFinished-> ABORTED       a late finish: never scored (wasted, or carried
    ABORTING --RequestAborted--> ABORTED         unscored by a policy that carries unfinished work)

GroupState (planner.py: one prompt's samples within a round)

    OPEN --R samples kept--------> COMPLETE    CloseGroup: trained this step
    OPEN --policy's to_defer-----> DEFERRED    its requests aborted; left incomplete this round
    (an OPEN or DEFERRED group at the round's end goes where the policy says: carried, deferred,
    returned)

RoundPhase (planner.py: the rollout part of a step)

    OPEN --target groups complete--> CLOSING   every running request is aborted
    CLOSING --no request left------> ENDED     EndRound

PromptStatus (prompt_pool.py: one prompt of one epoch; derived from the pool, never stored)

    FRESH --take--------------> IN_FLIGHT --complete--> COMPLETED (trained)
    IN_FLIGHT --defer---------> DEFERRED --take_deferred--> IN_FLIGHT
    IN_FLIGHT --release, recover--> FRESH

RewardStatus (stream_batcher.py: one kept sample's reward)

    AWAITING --RewardScored-------> SCORED
    AWAITING --the step ends------> DISCARDED  its group was not trained (a late reward is expected)
    DISCARDED --RewardScored------> DROPPED    the late reward is ignored; the entry goes
"""

from __future__ import annotations

import enum

from .errors import SchedulerMisuse
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


TRANSITIONS: dict[enum.Enum, frozenset[enum.Enum]] = {
    RequestState.RUNNING: frozenset({RequestState.FINISHED, RequestState.ABORTING, RequestState.DROPPED}),
    RequestState.ABORTING: frozenset({RequestState.ABORTED}),
    RequestState.FINISHED: frozenset(),
    RequestState.ABORTED: frozenset(),
    RequestState.DROPPED: frozenset(),
    GroupState.OPEN: frozenset({GroupState.COMPLETE, GroupState.DEFERRED}),
    GroupState.COMPLETE: frozenset(),
    GroupState.DEFERRED: frozenset(),
    RoundPhase.OPEN: frozenset({RoundPhase.CLOSING}),
    RoundPhase.CLOSING: frozenset({RoundPhase.ENDED}),
    RoundPhase.ENDED: frozenset(),
    PromptStatus.FRESH: frozenset({PromptStatus.IN_FLIGHT}),
    PromptStatus.IN_FLIGHT: frozenset({PromptStatus.DEFERRED, PromptStatus.FRESH, PromptStatus.COMPLETED}),
    PromptStatus.DEFERRED: frozenset({PromptStatus.IN_FLIGHT}),
    PromptStatus.COMPLETED: frozenset(),
    RewardStatus.AWAITING: frozenset({RewardStatus.SCORED, RewardStatus.DISCARDED}),
    RewardStatus.SCORED: frozenset(),
    RewardStatus.DISCARDED: frozenset({RewardStatus.DROPPED}),
    RewardStatus.DROPPED: frozenset(),
}
"""state -> the states it may move to.  Every member of every enum above is a key."""

INITIAL = (RequestState.RUNNING, GroupState.OPEN, RoundPhase.OPEN, PromptStatus.FRESH, RewardStatus.AWAITING)
"""The state each machine starts in."""


def transition(current: enum.Enum, new: enum.Enum, subject: object) -> enum.Enum:
    """`new`, if the table allows `current -> new`; else `SchedulerMisuse` naming `subject` (a request
    number, a prompt key, a step) and both states."""
    if new in TRANSITIONS[current]:
        return new
    if type(current) is RequestState and type(subject) is int:
        subject = request_id(subject)
    allowed = ", ".join(sorted(s.name for s in TRANSITIONS[current])) or "none: it is final"
    raise SchedulerMisuse(f"can't move {_NOUNS[type(current)]} {subject} from {current.name} to {new.name} "
                          f"(allowed from {current.name}: {allowed})")


_NOUNS = {RequestState: "request", GroupState: "group", RoundPhase: "round", PromptStatus: "prompt",
          RewardStatus: "reward of"}
