"""RollPacker's tail batching (arXiv 2509.21009), with two knobs the paper lacks.

Short round: launch ceil(eta_prompts * P) fresh prompts with ceil(eta_responses * R) responses
each.  A prompt is done when R of its responses finished (the first R; the rest are aborted); the
round ends when P prompts are done, every request still running is aborted, and the unfinished
prompts go to the long queue.  Long round: when the queue holds `long_round_at` (default P) prompts,
the next round takes P of them with exactly R responses each and runs them to max length: no
over-launch, no abort.  Once a finite dataset is all drawn (the pool's `epochs`), its last fresh
prompts (fewer than a short round launches) join the long queue, which is played whatever its size.
Aborted tokens are discarded, so every trained token is on-policy.

Knobs beyond the paper:
- `eta_responses=1.0`, the unbiased mode: a group is all R of its samples or nothing, so a group
  is never biased towards its shortest answers (only prompts are over-launched).
- `predict=True`: fresh prompts whose predicted length (pool history: shrunk mean of log length,
  floored by the longest cut) exceeds the `1/eta_prompts` quantile of all predicted lengths go
  straight to the long queue instead of wasting a speculative launch.  Prompts never seen are
  launched: prediction helps from their second visit on.
- `longest_first=True` (sibling-aware scheduling, core/sibling_prediction.py): a long round launches
  its prompts longest-predicted first (their siblings' lengths from the short round that deferred
  them are in the pool's history), so where the KV cache limits what runs at once the longest
  requests start first.
- `defer_at=f`: once f x P groups of a short round are complete, the live groups predicted longest
  from their finished siblings (history second) are aborted and deferred at once, keeping the
  ceil(eta_prompts x need) predicted shortest: fewer wasted tokens and a smaller running batch for
  the groups that will complete the round.
"""

from __future__ import annotations

import math

import attrs
import numpy as np
from attrs import field, frozen
from attrs.validators import optional

from ..errors import ConfigError
from ..round_state import LONG, SHORT, Group, PlannerState
from ..sibling_prediction import groups_to_defer, longest_first
from ..validators import at_least_one, fraction, optional_positive
from .policy_base import PolicyBase, over


@frozen(kw_only=True)
class TailPolicy(PolicyBase):
    """RollPacker's tail batching."""

    name = "tail"
    eta_prompts: float = field(default=1.25, validator=at_least_one)
    """Over-launch factor of prompts in short rounds."""
    eta_responses: float = field(default=1.25, validator=at_least_one)
    """Over-launch factor of responses per prompt in short rounds (1.0: unbiased groups)."""
    predict: bool = False
    """Send prompts predicted long straight to the long queue."""
    long_round_at: int | None = field(default=None, validator=optional_positive)
    """Long-queue size that triggers a long round (default: P)."""
    longest_first: bool = False
    """Long rounds launch their prompts longest-predicted first."""
    defer_at: float | None = field(default=None, validator=optional(fraction))
    """Short rounds: at this share of P complete, defer the live groups predicted longest."""

    def __attrs_post_init__(self) -> None:
        if self.long_round_at is not None and self.long_round_at < self.prompts:
            raise ConfigError(f"long_round_at must be >= prompts ({self.prompts}), got {self.long_round_at}")

    @property
    def long_trigger(self) -> int:
        return self.long_round_at or self.prompts

    def open_round(self, state: PlannerState) -> tuple[PlannerState, str, list[Group]]:
        pool = state.pool
        if len(pool.deferred) >= self.long_trigger or (pool.exhausted and pool.deferred):
            pool, keys = pool.take_deferred(self.prompts)
            if self.longest_first:
                keys = longest_first(keys, pool.history)
            return attrs.evolve(state, pool=pool), LONG, self.fresh_groups(keys, self.samples)
        want = over(self.prompts, self.eta_prompts)
        keys: list = []
        while len(keys) < want:
            pool, drawn = pool.take(want - len(keys))
            if not drawn:  # the dataset's last epoch is drawn: a smaller round
                break
            if self.predict:
                long = self._predicted_long(pool, drawn)
                pool = pool.defer(k for k in drawn if k in long)
                drawn = tuple(k for k in drawn if k not in long)
            keys.extend(drawn)
            if len(pool.deferred) >= self.long_trigger:  # enough long prompts: play them now
                pool = pool.release(keys)
                return self.open_round(attrs.evolve(state, pool=pool))
        if keys and len(keys) < want and pool.exhausted:  # the dataset's last prompts: no short round of
            return self.open_round(attrs.evolve(state, pool=pool.defer(keys)))  # a few, they join the long queue
        groups = self.fresh_groups(tuple(keys), over(self.samples, self.eta_responses))
        return attrs.evolve(state, pool=pool), SHORT, groups

    def _predicted_long(self, pool, keys) -> set:
        history = pool.history
        seen = np.flatnonzero((history.count + history.censored) > 0)
        if len(seen) < self.prompts:
            return set()
        cutoff = np.quantile(history.predicted_medians(seen), 1.0 / self.eta_prompts)
        indices = [k.index for k in keys]
        known = (history.count[indices] + history.censored[indices]) > 0
        longer = history.predicted_medians(indices) > cutoff
        return {k for k, is_known, is_long in zip(keys, known, longer) if is_known and is_long}

    def defer_point(self, kind: str, target: int) -> int | None:
        if self.defer_at is None or kind != SHORT:
            return None
        return max(1, math.ceil(round(self.defer_at * target, 9)))

    def to_defer(self, live: list[tuple[int, Group]], need: int, history, clock: int) -> tuple[int, ...]:
        return groups_to_defer(live, over(need, self.eta_prompts), history, clock)

    def close_round(self, state: PlannerState, kind: str, incomplete: list[Group]) -> PlannerState:
        return attrs.evolve(state, pool=state.pool.defer(g.prompt for g in incomplete))
