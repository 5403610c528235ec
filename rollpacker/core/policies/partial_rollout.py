"""APRIL-style partial rollout (active partial rollouts; Kimi k1.5's partial rollouts).

Each round launches the groups carried from earlier rounds plus fresh prompts up to
ceil(eta_prompts * P) groups, all R samples each (resuming carried prefixes).  When P groups are
complete the rest is aborted and carried: finished samples and partial responses, each token tagged
with the policy version that produced it.  Carried work whose oldest token would lag more than
`max_staleness` versions is dropped and its sample starts again.  Not on-policy: the fraction of
off-policy tokens is reported.  A sample that needs more than max_staleness + 1 rounds of
generation restarts each time; such prompts stay pending (never lost) - raise the bound for them.
"""

from __future__ import annotations

import attrs
from attrs import field, frozen

from ..round_state import NORMAL, Group, PlannerState
from ..validators import at_least_one, non_negative
from .policy_base import PolicyBase, over


@frozen(kw_only=True)
class PartialPolicy(PolicyBase):
    """APRIL / Kimi partial rollouts."""

    name = "partial"
    eta_prompts: float = field(default=1.25, validator=at_least_one)
    """Over-sampling factor of prompts per round."""
    staleness: int = field(default=1, validator=non_negative)
    """Most policy versions a trained token may lag."""

    carries = True

    @property
    def max_staleness(self) -> int:
        return self.staleness

    def open_round(self, state: PlannerState) -> tuple[PlannerState, str, list[Group]]:
        carried = list(state.carried)
        pool, keys = state.pool.take(max(0, over(self.prompts, self.eta_prompts) - len(carried)))
        groups = carried + self.fresh_groups(keys, self.samples)
        return attrs.evolve(state, pool=pool), NORMAL, groups

    def close_round(self, state: PlannerState, kind: str, incomplete: list[Group]) -> PlannerState:
        return state  # the planner carries the incomplete groups
