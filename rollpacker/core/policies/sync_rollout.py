"""The veRL baseline: P prompts x R responses, the round waits for every one of them."""

from __future__ import annotations

import attrs
from attrs import frozen

from ..round_state import NORMAL, Group, PlannerState
from .policy_base import PolicyBase


@frozen(kw_only=True)
class SyncPolicy(PolicyBase):
    """veRL's baseline."""

    name = "sync"

    def open_round(self, state: PlannerState) -> tuple[PlannerState, str, list[Group]]:
        pool, keys = state.pool.take(self.prompts)
        return attrs.evolve(state, pool=pool), NORMAL, self.fresh_groups(keys, self.samples)

    def close_round(self, state: PlannerState, kind: str, incomplete: list[Group]) -> PlannerState:
        assert not incomplete, "a sync round ends only when every group is complete"
        return state
