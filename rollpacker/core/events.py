"""Events: what happened, in the past tense.  A driver builds them from a backend's outputs and feeds
them to the core.  Every event carries `at`, the driver's clock in seconds, so the simulator and
real backends drive the same state machines (time is an input).
"""

from __future__ import annotations

import math

from attrs import field, frozen
from attrs.validators import ge, in_

from .errors import SchedulerMisuse

FINISH_REASONS = ("stop", "length")


def _finite(instance, attribute, value) -> None:
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SchedulerMisuse(f"{type(instance).__name__}.{attribute.name} must be finite, got {value!r}")


@frozen
class RequestFinished:
    """A request ended on its own: end of sequence ("stop") or max new tokens ("length")."""

    request_id: str
    num_tokens: int = field(validator=ge(0))
    """Tokens this request generated (not counting a resumed prefix)."""
    finish_reason: str = field(validator=in_(FINISH_REASONS))
    at: float = 0.0


@frozen
class RequestAborted:
    """A request was aborted (by our AbortRequest, or by the engine); `num_tokens` were generated."""

    request_id: str
    num_tokens: int = field(validator=ge(0))
    at: float = 0.0


@frozen
class TokensGenerated:
    """Progress: a running request has generated `num_tokens` so far."""

    request_id: str
    num_tokens: int = field(validator=ge(0))
    at: float = 0.0


@frozen
class RewardScored:
    """The reward of a kept sample arrived.  `failed` marks a scorer that raised or timed out (then
    the reward is 0 by convention); a NaN or infinite reward is refused here, at the boundary."""

    request_id: str
    reward: float = field(validator=_finite)
    failed: bool = False
    at: float = 0.0


Event = RequestFinished | RequestAborted | TokensGenerated | RewardScored
