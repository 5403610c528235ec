"""The backend error family: every way a rollout engine, reward executor or trainer fails or
answers wrongly.  A driver that catches `BackendError` catches every backend failure; the core's
`ConfigError` and `SchedulerMisuse` (bad input, a driver feeding the core what it cannot take)
stay outside it.

    BackendError                a backend failed or answered wrongly; the message names it
        SGLangError             talking to an SGLang(-compatible) server went wrong
            ServerUnavailable   a server did not answer (refused, timed out, died)
            ServerRejected      a server answered an HTTP error or `success: false`
            BackendProtocolError  a server answered something that is not SGLang's wire format
        EngineFailed            the embedded engine's decode thread died (cause chained)
            GraphCaptureFailed  a CUDA graph of a decode bucket could not be captured (no silent eager fallback)
        RewardExecutorFailed    the reward executor's dispatcher thread died, or a worker
                                process could not be started (cause chained)
        InvalidMicroBatch       a trainer refuses a micro-batch (also a `ValueError`)
        BackendMisuse           a backend called in a way it cannot take: closed, a duplicate or
                                unknown request id (also a `ValueError`)
        TrainerFailed           a trainer call on the driver's train worker raised (cause chained)

Foreign exceptions (aiohttp, JSON decoding, a dead worker thread or process) are translated where
a backend crosses its I/O boundary, with `raise X(...) from exc` and a message naming the server
URL, request id or micro-batch sample; a bug inside a backend is not wrapped.
"""

from __future__ import annotations

from rollpacker.core.errors import BackendError, TrainerFailed  # (defined with the core: the driver raises
# TrainerFailed and catches BackendError without importing a backend)


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


class GraphCaptureFailed(EngineFailed):
    """Capturing the CUDA graph of one decode bucket failed; the message names the bucket, the
    cause is chained.  Raised instead of decoding eagerly, which would silently change what a
    benchmark or a policy comparison measures."""


class RewardExecutorFailed(BackendError):
    """The reward executor cannot score any more (its dispatcher thread died, or a worker process
    could not be started); the cause is chained."""


class InvalidMicroBatch(BackendError, ValueError):
    """A micro-batch the trainer refuses; the message names the sample and field."""


class BackendMisuse(BackendError, ValueError):
    """A backend was called in a way it cannot take (it is closed; a request id already running,
    or never submitted); the message names the id.  The engine's misuse, not the core's:
    `SchedulerMisuse` is for events the core's state machines refuse."""


__all__ = [
    "BackendError",
    "BackendMisuse",
    "BackendProtocolError",
    "EngineFailed",
    "GraphCaptureFailed",
    "InvalidMicroBatch",
    "RewardExecutorFailed",
    "SGLangError",
    "ServerRejected",
    "ServerUnavailable",
    "TrainerFailed",
]
