"""Planner policies, one paper per file, and their registry:
`make_policy("tail", prompts=..., samples=..., max_tokens=..., **knobs)`.

    sync_rollout.py     the veRL baseline: P x R, wait for every response
    tail_batching.py    RollPacker: short rounds over-launch, long rounds take the deferred tail
    sorted_rl.py        SortedRL: grouped loading, completion-order update batches
    partial_rollout.py  APRIL / Kimi partial rollouts: abort at target, resume next round
    policy_base.py      the fields and helpers they share
    knobs.py            each policy's knobs (name, type, default, docstring) for the CLIs

A new policy is one file with its attrs class plus `register_policy("name", Class)` (from the
package, or from a plugin module: see rollpacker.plugins); both CLIs then offer it and its knobs.
"""

from __future__ import annotations

import attrs

from ..errors import ConfigError
from .knobs import RUN_SHAPE, Knob, KnobSection, knob_section, knobs_of
from .partial_rollout import PartialPolicy
from .sorted_rl import SortedPolicy
from .sync_rollout import SyncPolicy
from .tail_batching import TailPolicy

__all__ = ["POLICIES", "RUN_SHAPE", "Knob", "KnobSection", "PartialPolicy", "SortedPolicy", "SyncPolicy", "TailPolicy", "knob_specs",
           "make_policy", "policy_sections", "policy_knobs", "register_policy"]

POLICIES = {"sync": SyncPolicy, "tail": TailPolicy, "sorted": SortedPolicy, "partial": PartialPolicy}
"""The policy registry: name -> attrs class (its fields past the run's shape are its knobs)."""


def register_policy(name: str, cls: type) -> None:
    """Add policy `cls` as --policy `name` of both CLIs, its knobs as flags (before they are imported)."""
    if not name.isidentifier() or name in POLICIES:
        raise ConfigError(f"policy name {name!r} must be a new Python identifier (registered: {', '.join(POLICIES)})")
    if not attrs.has(cls) or not set(RUN_SHAPE) <= {f.name for f in attrs.fields(cls)}:
        raise ConfigError(f"policy {name!r}: {cls!r} must be an attrs class with the fields {', '.join(RUN_SHAPE)} "
                          f"(subclass rollpacker.core.policies.policy_base.PolicyBase)")
    POLICIES[name] = cls


def make_policy(name: str, **knobs):
    """Build a policy by name; an unknown name or knob is a `ConfigError` listing the valid ones."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ConfigError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None
    fields = {f.name for f in attrs.fields(cls)}
    unknown = sorted(set(knobs) - fields)
    if unknown:
        raise ConfigError(f"policy {name!r} has no knob {unknown[0]!r}; its knobs: {', '.join(sorted(fields))}")
    return cls(**knobs)


def policy_knobs(name: str) -> dict[str, object]:
    """Every knob of a policy with its default (attrs.NOTHING for required ones)."""
    return {f.name: f.default for f in attrs.fields(POLICIES[name])}


def knob_specs(name: str) -> tuple[Knob, ...]:
    """The knobs of policy `name` (every field but the run's shape), with types, defaults and help."""
    return knobs_of(POLICIES[name])


def policy_sections() -> list[KnobSection]:
    """One section of knob flags per registered policy (`--tail.eta-prompts`), as both CLIs list them."""
    return [knob_section("policy", name, cls) for name, cls in POLICIES.items()]
