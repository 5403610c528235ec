"""Fields every planner policy shares, and helpers to build groups."""

from __future__ import annotations

import math

from attrs import field, frozen

from ..records import PromptKey
from ..round_state import Group
from ..validators import optional_positive, positive


@frozen(kw_only=True)
class PolicyBase:
    prompts: int = field(validator=positive)
    """P: prompts trained per step."""
    samples: int = field(validator=positive)
    """R: responses per prompt (the GRPO group size)."""
    max_tokens: int = field(validator=positive)
    """Most new tokens of one response."""
    capacity: int | None = field(default=None, validator=optional_positive)
    """Most requests running at once; None launches the whole round at once (sorted: P x R)."""

    carries = False
    max_staleness = 0

    def defer_point(self, kind: str, target: int) -> int | None:
        """Completed groups at which the planner asks `to_defer` once (None: never)."""
        return None

    def to_defer(self, live: list[tuple[int, Group]], need: int, history, clock: int) -> tuple[int, ...]:
        """Slots of live groups to abort and leave incomplete now (`need` more must complete)."""
        return ()

    def fresh_groups(self, keys: tuple[PromptKey, ...], launches: int) -> list[Group]:
        """New groups, each with `launches` sample indices waiting to launch."""
        pending = tuple((i, ()) for i in range(launches))
        return [Group(key, pending=pending, next_index=launches) for key in keys]


def over(n: int, eta: float) -> int:
    """ceil(eta * n), robust to float noise (1.25 * 8 is 10, not 11)."""
    return max(n, math.ceil(round(eta * n, 9)))
