"""Field validators shared by the core's config classes; each raises `ConfigError` naming the field."""

from __future__ import annotations

from .errors import ConfigError


def positive(instance, attribute, value) -> None:
    """An integer >= 1 (a count)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{attribute.name} must be an integer >= 1, got {value!r}")


def optional_positive(instance, attribute, value) -> None:
    """None, or an integer >= 1."""
    if value is not None:
        positive(instance, attribute, value)


def at_least_one(instance, attribute, value) -> None:
    """A number >= 1 (an over-launch factor, eta)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 1.0:
        raise ConfigError(f"{attribute.name} must be a number >= 1, got {value!r}")


def non_negative(instance, attribute, value) -> None:
    """An integer >= 0."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{attribute.name} must be an integer >= 0, got {value!r}")
