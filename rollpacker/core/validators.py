"""Field validators shared by the config classes: `attrs.validators`, a failure raised as a
`ConfigError` (the caller's configuration is at fault) that names the field, the rule and the value.

A number is finite: NaN fails every comparison and infinity passes the lower bounds, so both are
refused here, once, rather than turning up as a crash or a NaN in a result.  `config_check` builds a
validator from a rule and its checks; `label` says how the field is named (its name, or the flag that
sets it: see rollpacker.sim.config)."""

from __future__ import annotations

import math

from attrs.validators import and_, ge, gt, instance_of, le, lt, not_, optional

from .errors import ConfigError


def field_name(instance, attribute) -> str:
    """The field's name, under the `section` its class declares if it declares one (train.mfu: the
    key `rollpacker simulate --set` takes)."""
    section = getattr(type(instance), "section", None)
    return f"{section}.{attribute.name}" if isinstance(section, str) else attribute.name


def flag_name(instance, attribute) -> str:
    """The command-line flag of a config field: engine_capacity -> --engine-capacity."""
    return "--" + attribute.name.replace("_", "-")


def config_check(rule: str, *validators, label=field_name):
    """All of `validators`; a value they refuse is a `ConfigError`: "<label> must be <rule>, got <value>"."""
    check = and_(*validators)

    def validate(instance, attribute, value) -> None:
        try:
            check(instance, attribute, value)
        except (TypeError, ValueError):
            raise ConfigError(f"{label(instance, attribute)} must be {rule}, got {value!r}") from None

    return validate


def _finite(instance, attribute, value) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{attribute.name} is not finite")


_NOT_BOOL = not_(instance_of(bool))
INTEGER = (instance_of(int), _NOT_BOOL)
"""The checks of an integer (a bool is not one)."""
NUMBER = (instance_of((int, float)), _NOT_BOOL, _finite)
"""The checks of a finite number."""

positive = config_check("an integer >= 1", *INTEGER, ge(1))
"""A count."""
optional_positive = optional(positive)
"""None, or an integer >= 1."""
non_negative = config_check("an integer >= 0", *INTEGER, ge(0))
at_least_one = config_check("a finite number >= 1", *NUMBER, ge(1.0))
"""An over-launch factor (eta)."""
positive_number = config_check("a finite number > 0", *NUMBER, gt(0))
"""A size, a rate or a time."""
non_negative_number = config_check("a finite number >= 0", *NUMBER, ge(0))
"""A cost that may be nothing."""
fraction = config_check("a number in (0, 1]", *NUMBER, gt(0), le(1))
"""A share of something that must not be empty (a memory fraction, an MFU)."""
probability = config_check("a number in [0, 1)", *NUMBER, ge(0), lt(1))
"""A chance or a share kept back that must leave something (a hang rate, a watermark)."""
