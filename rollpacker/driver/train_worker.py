"""TrainWorker: the trainer on a thread of its own, so the driver's control loop never waits on training.

The driver hands it the core's micro-batches as they come (`forward_backward`, which returns at
once) and polls what finished (`poll`, like the engine's); meanwhile it keeps feeding the core the
engine's events, so the round still ends, and its tail is still aborted, at the moment the P-th
group completes, however long a micro-batch takes.  Only the optimizer step waits: `call` runs a
function on the worker after every job queued before it and blocks until it returns, so
`optimizer_step` sees the gradient of every micro-batch of the step, accumulated in the core's
order (one thread, one queue: first in, first trained), exactly as a synchronous loop would.

Why a thread: torch releases the GIL inside its kernels, the embedded engine already decodes on a
thread of its own, and a process would have to ship every micro-batch and the weights across.  On
CUDA the worker issues its kernels on the device's default stream, as the engine's thread does, so
the GPU interleaves the two in issue order (a stream of its own is not measured yet).

A trainer call that raises stops the worker: every later job is dropped, and the driver's next
`poll` or `call` raises `TrainerFailed` naming the job, with the trainer's exception as its cause.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from attrs import frozen

from rollpacker.core.errors import TrainerFailed
from rollpacker.core.protocols import MicroBatch, Trainer, TrainStats

from .clock import Clock

T = TypeVar("T")

OPTIMIZER_STEP = "optimizer step"
"""The `what` of the step's optimizer call (the driver's; a training span like the micro-batches')."""


@frozen
class TrainerRan:
    """One job the worker finished: what it was, its result, and when it ran (on the driver's clock)."""

    what: str
    """"micro-batch 3", "optimizer step", "export weights"."""
    start: float
    end: float
    stats: TrainStats | None = None
    """A micro-batch's or the optimizer step's statistics."""
    micro_batch: int | None = None
    """The core's index of the micro-batch (None for other jobs)."""


@frozen
class _Job:
    what: str
    run: Callable[[Trainer], Any]
    done: Future
    micro_batch: int | None = None


_STOP = object()


class TrainWorker:
    def __init__(self, trainer: Trainer, clock: Clock) -> None:
        self.trainer = trainer
        self.clock = clock
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._ran: queue.SimpleQueue[TrainerRan] = queue.SimpleQueue()
        self._failure: tuple[str, BaseException] | None = None
        self._closing = False
        self.running: str | None = None
        """The job on the trainer now (None when idle): what a timeout message names."""
        self._thread = threading.Thread(target=self._loop, name="rollpacker-train", daemon=True)
        self._thread.start()

    # -- the driver's side -----------------------------------------------------------------------

    def forward_backward(self, index: int, batch: MicroBatch) -> Future:
        """Queue micro-batch `index`; returns at once (its `TrainerRan` comes back through `poll`)."""
        self._raise_failure()
        return self._put(_Job(f"micro-batch {index}", lambda t: t.forward_backward(batch), Future(), index))

    def call(self, what: str, run: Callable[[Trainer], T], timeout: float | None = None) -> T:
        """Run `run(trainer)` on the worker after every job queued before it; wait (at most `timeout`
        seconds: then `TimeoutError`) and return its result."""
        self._raise_failure()
        done = self._put(_Job(what, run, Future())).done
        try:
            return done.result(timeout)
        except TimeoutError:
            raise
        except BaseException:  # the job (or one before it) failed: say which, with its cause
            self._raise_failure()
            raise

    def export_weights(self) -> dict[str, Any]:
        """The trainer's weights, read on the worker (so `sync_weights` can take the worker as its trainer)."""
        return self.call("export weights", lambda t: t.export_weights())

    def poll(self) -> list[TrainerRan]:
        """The jobs finished since the last poll, in order; never blocks.  Raises `TrainerFailed` once one failed."""
        out = []
        while True:
            try:
                out.append(self._ran.get_nowait())
            except queue.Empty:
                break
        self._raise_failure()
        return out

    def close(self, timeout: float = 10.0) -> None:
        """Drop the queued jobs and stop (a job still running is waited for at most `timeout` seconds;
        the thread is a daemon, so a stuck trainer cannot keep the process alive)."""
        self._closing = True
        self._jobs.put(_STOP)
        self._thread.join(timeout)

    def _put(self, job: _Job) -> _Job:
        if not self._thread.is_alive():
            raise TrainerFailed(f"the train worker is stopped: cannot run {job.what}")
        self._jobs.put(job)
        return job

    def _raise_failure(self) -> None:
        if self._failure is not None:
            what, exc = self._failure
            raise TrainerFailed(f"the trainer failed on {what}: {type(exc).__name__}: {exc}") from exc

    # -- the worker's thread ---------------------------------------------------------------------

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not _STOP:
            if self._failure is not None or self._closing:  # a job before it failed: the step is lost
                why = "the train worker is closing" if self._failure is None else f"{self._failure[0]} failed"
                job.done.set_exception(TrainerFailed(f"{job.what} dropped: {why}"))
                continue
            self.running = job.what
            start = self.clock.now()
            try:
                result = job.run(self.trainer)
            except BaseException as exc:  # noqa: BLE001 - reported on the driver's thread
                self._failure = (job.what, exc)
                self.running = None
                job.done.set_exception(exc)
                continue
            stats = result if isinstance(result, TrainStats) else None
            self._ran.put(TrainerRan(job.what, start, self.clock.now(), stats, job.micro_batch))
            self.running = None
            job.done.set_result(result)
