"""What a round planner policy is (`Policy`): the decisions of a policy (which groups a round plays,
where unfinished ones go, when to defer live groups), the transitions being the planner's
(core/planner.py; the built-in policies are in core/policies/)."""

from __future__ import annotations

from typing import Protocol

from .round_state import Group, PlannerState


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
