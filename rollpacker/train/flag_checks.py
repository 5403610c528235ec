"""Field validators of the run's component configs: a bad value is one ConfigError naming its flag
("--engine-capacity must be >= 1, got 0"), raised when the config is built, before any model loads."""

from __future__ import annotations

import math

from rollpacker.core.errors import ConfigError


def flag(attribute) -> str:
    """The command-line flag of a config field: engine_capacity -> --engine-capacity."""
    return "--" + attribute.name.replace("_", "-")


def at_least(low: int):
    """An integer field >= `low`."""
    def validate(instance, attribute, value) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ConfigError(f"{flag(attribute)} must be >= {low}, got {value}")
    return validate


def positive_finite(instance, attribute, value) -> None:
    """A time or a rate: finite and > 0 (a NaN fails every comparison, so the good range is tested)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{flag(attribute)} must be > 0, got {value}")
