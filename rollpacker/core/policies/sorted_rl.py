"""SortedRL's length-aware scheduling (arXiv 2603.23414).

Grouped loading: `group_batches` (n, default 4) rollout batches of P prompts are loaded at once,
and nothing new is loaded until all of them are trained.  Requests are launched up to `capacity`
(the engine's running-batch limit, default P x R) so the engine stays full, and completed groups
form the update batch in completion order (short first: a micro-curriculum).  A round ends when P
groups are complete.

`mode="on_policy"` (default): unfinished work is dropped after each update and the prompt stays in
the loaded buffer, to be sampled again by the new policy.  `mode="partial"`: finished samples and
partial responses are kept (with their policy versions) as long as no token lags more than
`max_staleness` versions.

Beyond the paper, `prefetch=True` (default) loads the next group as soon as fewer than 2P prompts
of the current one are left: the group's last update batch would otherwise run with only P prompts
in flight and drain the engine like a sync round.  `prefetch=False` is the paper's strict grouping.  `longest_first=True` launches the loaded prompts
longest-predicted first (core/sibling_prediction.py): the engine's capacity goes to the longest work
first, instead of the dataset order.
"""

from __future__ import annotations

from typing import Literal, get_args

import attrs
from attrs import field, frozen
from attrs.validators import in_

from ..round_state import NORMAL, Group, PlannerState
from ..sibling_prediction import longest_first
from ..validators import non_negative, positive
from .policy_base import PolicyBase

Mode = Literal["on_policy", "partial"]
MODES = get_args(Mode)


@frozen(kw_only=True)
class SortedPolicy(PolicyBase):
    """SortedRL."""

    name = "sorted"
    group_batches: int = field(default=4, validator=positive)
    """n: rollout batches loaded together."""
    mode: Mode = field(default="on_policy", validator=in_(MODES))
    """on_policy drops unfinished work after each update; partial keeps it (bounded staleness)."""
    staleness: int = field(default=1, validator=non_negative)
    """Partial mode: most policy versions a trained token may lag."""
    prefetch: bool = True
    """Load the next group when fewer than 2P prompts of the current one are left."""
    longest_first: bool = False
    """Launch the loaded prompts longest-predicted first (else in dataset order)."""

    def __attrs_post_init__(self) -> None:
        if self.capacity is None:
            object.__setattr__(self, "capacity", self.prompts * self.samples)

    @property
    def carries(self) -> bool:
        return self.mode == "partial"

    @property
    def max_staleness(self) -> int:
        return self.staleness if self.carries else 0

    def open_round(self, state: PlannerState) -> tuple[PlannerState, str, list[Group]]:
        pool, loaded = state.pool, state.loaded
        if not loaded or (self.prefetch and len(loaded) < 2 * self.prompts):
            pool, more = pool.take(self.group_batches * self.prompts)
            loaded = loaded + more
        carried = {g.prompt: g for g in state.carried}
        fresh = self.fresh_groups(tuple(k for k in loaded if k not in carried), self.samples)
        by_prompt = {g.prompt: g for g in fresh} | carried
        order = longest_first(loaded, pool.history) if self.longest_first else loaded
        groups = [by_prompt[k] for k in order]
        return attrs.evolve(state, pool=pool, loaded=loaded), NORMAL, groups

    def close_round(self, state: PlannerState, kind: str, incomplete: list[Group]) -> PlannerState:
        remaining = {g.prompt for g in incomplete}
        return attrs.evolve(state, loaded=tuple(k for k in state.loaded if k in remaining))
