"""Errors of the core, separated by who is at fault (as h11 does).

`ConfigError` is bad input at a constructor boundary; `SchedulerMisuse` is a driver that fed an
event the state machine cannot accept (unknown or duplicate request id, a reward for a sample that
was never kept).  Both are `ValueError`s and name the field or request they are about.  A backend
that fails or answers wrongly raises a `BackendError`, a `RollpackerError` defined with the backends
(the core imports none of them).
"""


class RollpackerError(Exception):
    """Base class of every error raised by rollpacker."""


class ConfigError(RollpackerError, ValueError):
    """A configuration value is out of range; the message names the field."""


class SchedulerMisuse(RollpackerError, ValueError):
    """The driver fed an event that the current state cannot take; the message names the request."""
