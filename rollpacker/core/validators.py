"""Field validators shared by the core's config classes: `attrs.validators`, a failure raised as a
`ConfigError` (the caller's configuration is at fault) that names the field, the rule and the value."""

from __future__ import annotations

from attrs.validators import and_, ge, gt, instance_of, not_, optional

from .errors import ConfigError


def config_check(rule: str, *validators):
    """All of `validators`; a value they refuse is a `ConfigError`: "<field> must be <rule>, got <value>"."""
    check = and_(*validators)

    def validate(instance, attribute, value) -> None:
        try:
            check(instance, attribute, value)
        except (TypeError, ValueError):
            raise ConfigError(f"{attribute.name} must be {rule}, got {value!r}") from None

    return validate


_NOT_BOOL = not_(instance_of(bool))
_INTEGER = (instance_of(int), _NOT_BOOL)
_NUMBER = (instance_of((int, float)), _NOT_BOOL)

positive = config_check("an integer >= 1", *_INTEGER, ge(1))
"""A count."""
optional_positive = optional(positive)
"""None, or an integer >= 1."""
non_negative = config_check("an integer >= 0", *_INTEGER, ge(0))
at_least_one = config_check("a number >= 1", *_NUMBER, ge(1.0))
"""An over-launch factor (eta)."""
positive_number = config_check("a number > 0", *_NUMBER, gt(0))
"""A size, a rate or a time."""
