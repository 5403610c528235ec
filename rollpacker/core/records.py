"""Small frozen records shared by the core's components: prompt keys, request ids, token segments,
samples.  Nothing here holds token ids: the driver keeps those, keyed by our request ids.
"""

from __future__ import annotations

import attrs
from attrs import field, frozen

from .errors import SchedulerMisuse

# Request ids are ours, unique and fixed-width.  SGLang's /abort_request matches rids by prefix, so
# no id may be a prefix of another: a fixed width guarantees it.
REQUEST_ID_PREFIX = "rp"
REQUEST_ID_DIGITS = 12
SEED_RANGE = 1 << 31
"""Sampling seeds lie in [0, 2**31): every engine takes them (SGLang's sampling_seed, torch generators)."""


def request_id(number: int) -> str:
    """The request id of our `number`-th request: `rp000000000042`."""
    return f"{REQUEST_ID_PREFIX}{number:0{REQUEST_ID_DIGITS}d}"


_ID_LENGTH = len(REQUEST_ID_PREFIX) + REQUEST_ID_DIGITS


def request_number(rid: str) -> int:
    """Inverse of `request_id`; a malformed id is a `SchedulerMisuse` naming it."""
    if type(rid) is str and len(rid) == _ID_LENGTH and rid[:2] == REQUEST_ID_PREFIX and rid[2:].isdigit():
        return int(rid[2:])
    raise SchedulerMisuse(f"unknown request id {rid!r}: not one of ours (expected rp + 12 digits)")


def sampling_seed(run_seed: int, number: int) -> int:
    """The sampling seed of our `number`-th request in a run seeded `run_seed` (`LaunchRequest.seed`):
    distinct for every request of the run (its first 2**31), so the samples of a group differ, and
    the same when the run is repeated with its seed."""
    return (run_seed * 1_000_003 + number) % SEED_RANGE


@frozen(order=True)
class PromptKey:
    """One prompt of one epoch: the unit that is trained exactly once per epoch."""

    epoch: int
    """Epoch the prompt was drawn in (0-based)."""
    index: int
    """Index of the prompt in the dataset."""

    def __str__(self) -> str:
        return f"e{self.epoch}/p{self.index}"


@frozen
class Segment:
    """A run of response tokens produced by one request under one policy version.

    A response resumed across rounds (partial rollout) is a tuple of segments; the driver joins the
    token ids of the segments' requests to rebuild the prefix.
    """

    request_id: str
    num_tokens: int
    policy_version: int


@frozen
class Sample:
    """A finished response that the planner keeps for training."""

    request_id: str
    """Id of the request that finished it (its last segment)."""
    prompt: PromptKey
    sample_index: int
    segments: tuple[Segment, ...]
    finish_reason: str
    """"stop" (end of sequence) or "length" (hit max tokens)."""
    num_tokens: int = field(init=False, eq=False)
    """Response length: the tokens of all segments."""
    number: int = field(init=False, eq=False, repr=False)
    """`request_number(request_id)`, parsed once."""

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "num_tokens", sum(s.num_tokens for s in self.segments))
        object.__setattr__(self, "number", request_number(self.request_id))

    def staleness(self, policy_version: int) -> int:
        """How many policy versions the oldest token lags behind `policy_version`."""
        if not self.segments:
            return 0
        return policy_version - min(s.policy_version for s in self.segments)

    def tokens_older_than(self, policy_version: int) -> int:
        """Tokens produced by a policy older than `policy_version` (off-policy tokens)."""
        return sum(s.num_tokens for s in self.segments if s.policy_version < policy_version)


def state(cls):
    """Class decorator for the core's internal state on the per-event path (planner and batcher
    state, groups, request records): frozen attrs, kept in `__dict__` rather than slots so that
    `replace` is one dict copy."""
    return attrs.frozen(cls, slots=False)


_new = object.__new__
_set = object.__setattr__


def replace(inst, **changes):
    """`attrs.evolve` for `@state` classes without re-running validators: a copy of the instance's
    fields with `changes` applied (about 0.3 us; a plain evolve costs 3-5 us).  Boundary records
    that need validation are built with their constructors."""
    fields = inst.__dict__.copy()
    fields.update(changes)  # (unchecked: `changes` must name fields of the class)
    new = _new(inst.__class__)
    _set(new, "__dict__", fields)
    return new
