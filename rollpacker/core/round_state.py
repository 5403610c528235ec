"""The planner's immutable state: request records, groups, the round being played, and its tally.

Kept apart from the transitions (planner.py) so policies can read it without importing them.
Per-event updates touch a persistent map (`immutables.Map`, a hash array mapped trie: an update
copies one path, not the table) and a few small records; logs that grow during a round are cons
lists `(item, rest)`, so appending never copies.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from attrs import field
from immutables import Map

from .prompt_pool import PromptPool
from .records import PromptKey, Sample, Segment, state
from .states import GroupState, RequestState, RoundPhase

SHORT, LONG, NORMAL = "short", "long", "normal"

Cons = tuple[Any, "Cons"] | None


def cons_iter(log: Cons) -> Iterator[Any]:
    """Items of a cons list, newest first."""
    while log is not None:
        item, log = log
        yield item


@state
class RequestRecord:
    """One launched request."""

    prompt: PromptKey
    slot: int
    """Slot of its group in the round's group table."""
    sample_index: int
    resume: tuple[Segment, ...]
    policy_version: int
    state: RequestState = RequestState.RUNNING
    """RUNNING or ABORTING (we sent AbortRequest: its answer is never scored); the record goes
    when the request ends (states.py)."""


@state
class Group:
    """A prompt's group of samples within a round.

    Invariant: len(kept) <= samples; a request number is in `running` iff its record is live;
    `unscored` is a subsequence of `kept`.
    """

    prompt: PromptKey
    kept: tuple[Sample, ...] = ()
    running: frozenset[int] = frozenset()
    pending: tuple[tuple[int, tuple[Segment, ...]], ...] = ()
    """Samples waiting to launch: (sample_index, resume prefix)."""
    next_index: int = 0
    """Next fresh sample index."""
    state: GroupState = GroupState.OPEN
    unscored: tuple[Sample, ...] = ()
    """Kept samples not yet scored: late finishes of requests we aborted, carried by a policy that
    carries unfinished work.  They are scored when the group completes, so a sample that goes
    stale first is never scored."""

    @property
    def is_complete(self) -> bool:
        return self.state is GroupState.COMPLETE


@state
class Tally:
    """Token accounting of the round.  Identity checked by the tests:
    generated + carried_in == kept + wasted + carried_out (at the round's end).

    `generated`, `ended_requests` and `ended_tokens` are summed once, at the round's end, from the
    round's observations (one per ended request), so a plain finish does not touch the tally."""

    launched: int = 0
    generated: int = 0
    wasted: int = 0
    carried_in: int = 0
    retried: int = 0
    """Requests relaunched after an abort we did not ask for (engine failure)."""
    ended_requests: int = 0
    ended_tokens: int = 0
    """Length (with prefix) of every request that ended this round, kept or not."""


@state
class RoundState:
    kind: str
    step: int
    target: int
    """Groups that complete this round."""
    groups: Map = field(factory=Map)
    num_groups: int = 0
    num_completed: int = 0
    queue: tuple[int, ...] = ()
    """Slots with pending launches, in launch order (used when the planner limits concurrency)."""
    phase: RoundPhase = RoundPhase.OPEN
    tally: Tally = field(factory=Tally)
    observations: Cons = None
    """(dataset index, length with prefix, finished, tokens generated) of every request that ended:
    the pool's length history and the tally's generated / ended counts."""


@state
class PlannerState:
    pool: PromptPool
    step: int = 0
    """Steps done; also the version of the policy that generates this step's round (one
    optimizer step per round)."""
    next_request: int = 0
    requests: Map = field(factory=Map)
    round: RoundState | None = None
    carried: tuple[Group, ...] = ()
    """Unfinished groups kept for the next round (partial modes)."""
    loaded: tuple[PromptKey, ...] = ()
    """SortedRL's loaded group of prompts, not yet trained."""

    @property
    def num_running(self) -> int:
        return len(self.requests)

    @property
    def in_round(self) -> bool:
        return self.round is not None
