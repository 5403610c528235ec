"""Errors of the core, separated by who is at fault (as h11 does).

`ConfigError` is bad input at a constructor boundary; `SchedulerMisuse` is a driver that fed an
event the state machine cannot accept (unknown or duplicate request id, a reward for a sample that
was never kept).  Both are `ValueError`s and name the field or request they are about.  A backend
that fails or answers wrongly raises a `BackendError`: its base is here, beside the Protocols the
backends implement, so a driver catches backend failures without importing a backend; the backends'
own kinds are in the backends' errors module (which re-exports these two).  `TrainerFailed` is the
driver's train worker's (a trainer call on its thread raised).
"""


class RollpackerError(Exception):
    """Base class of every error raised by rollpacker."""


class ConfigError(RollpackerError, ValueError):
    """A configuration value is out of range; the message names the field."""


class SchedulerMisuse(RollpackerError, ValueError):
    """The driver fed an event that the current state cannot take; the message names the request."""


class BackendError(RollpackerError):
    """A backend (rollout engine, reward executor, trainer) failed or answered wrongly."""


class TrainerFailed(BackendError):
    """A trainer call on the driver's train worker thread raised (the trainer's own error, an
    `InvalidMicroBatch` included, is the cause); the message names the micro-batch or call."""
