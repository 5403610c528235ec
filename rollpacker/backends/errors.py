"""The backend error family: every way a rollout engine, reward executor or trainer fails or
answers wrongly.  A driver that catches `BackendError` catches every backend failure; the core's
`ConfigError` and `SchedulerMisuse` (bad input, misuse) stay outside it.

    BackendError                a backend failed or answered wrongly; the message names it
        SGLangError             talking to an SGLang(-compatible) server went wrong
            ServerUnavailable   a server did not answer (refused, timed out, died)
            ServerRejected      a server answered an HTTP error or `success: false`
            BackendProtocolError  a server answered something that is not SGLang's wire format
        EngineFailed            the embedded engine's decode thread died (cause chained)
        RewardExecutorFailed    the reward executor's dispatcher thread died, or a worker
                                process could not be started (cause chained)
        InvalidMicroBatch       a trainer refuses a micro-batch (also a `ValueError`)
        TrainerFailed           a trainer call on the driver's train worker raised (cause chained)

Foreign exceptions (aiohttp, JSON decoding, a dead worker thread or process) are translated where
a backend crosses its I/O boundary, with `raise X(...) from exc` and a message naming the server
URL, request id or micro-batch sample; a bug inside a backend is not wrapped.
"""

from __future__ import annotations

from rollpacker.core.errors import RollpackerError


class BackendError(RollpackerError):
    """A backend (rollout engine, reward executor, trainer) failed or answered wrongly."""


class SGLangError(BackendError):
    """Something went wrong talking to an SGLang(-compatible) server; the message names it."""


class ServerUnavailable(SGLangError):
    """A server did not answer (connection refused, timed out, died); the message names it."""


class ServerRejected(SGLangError):
    """A server answered with an HTTP error or `success: false`; the message names it."""


class BackendProtocolError(SGLangError):
    """A server answered something that is not SGLang's wire format; the message names it."""


class EngineFailed(BackendError):
    """The embedded engine's decode thread died; the cause is chained."""


class RewardExecutorFailed(BackendError):
    """The reward executor cannot score any more (its dispatcher thread died, or a worker process
    could not be started); the cause is chained."""


class InvalidMicroBatch(BackendError, ValueError):
    """A micro-batch the trainer refuses; the message names the sample and field."""


class TrainerFailed(BackendError):
    """A trainer call on the driver's train worker thread raised (the trainer's own error, an
    `InvalidMicroBatch` included, is the cause); the message names the micro-batch or call."""


__all__ = [
    "BackendError",
    "BackendProtocolError",
    "EngineFailed",
    "InvalidMicroBatch",
    "RewardExecutorFailed",
    "SGLangError",
    "ServerRejected",
    "ServerUnavailable",
    "TrainerFailed",
]
