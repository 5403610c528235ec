"""Field validators of the run's component configs: a bad value is one ConfigError naming its flag
("--engine-capacity must be >= 1, got 0"), raised when the config is built, before any model loads.
They are the core's checks (rollpacker.core.validators) with the field named by its flag."""

from __future__ import annotations

from attrs.validators import ge, gt

from rollpacker.core.validators import INTEGER, NUMBER, config_check, flag_name


def at_least(low: int):
    """An integer field >= `low`."""
    return config_check(f">= {low}", *INTEGER, ge(low), label=flag_name)


positive_finite = config_check("> 0", *NUMBER, gt(0), label=flag_name)
"""A time or a rate: finite and > 0."""
non_negative_finite = config_check(">= 0", *NUMBER, ge(0), label=flag_name)
"""A time that may be 0 (off): finite and >= 0."""
