"""The driver's watch over one step: its time limit (`StepTimeout`) and a backend that has nothing
left to report while the step is not done (`StepStalled`: a deadlock).

Both are decided on the driver's clock, so a simulated step stalls, or times out, as a live one does.
A backend's `wait` that returns nothing and leaves the clock where it was has nothing more to
report (a simulator's event heap is empty; a real backend's wait always takes some time): the
step can never end.  Both errors name what was pending: the core's running requests, and what the
backend says it still waits for (its optional `pending_work()`)."""

from __future__ import annotations

from rollpacker.core import Scheduler
from rollpacker.core.errors import RollpackerError

from .clock import Clock


class StepTimeout(RollpackerError):
    """A step ran past its time limit (a stuck engine or scorer); names what was pending."""


class StepStalled(RollpackerError):
    """The backend has nothing left to report and the step is not done (a deadlock); names what was pending."""


class StepWatch:
    """The step's start and limit on `clock`; the errors the driver (and a backend's long wait) raise."""

    def __init__(self, scheduler: Scheduler, clock: Clock, limit_s: float | None = None) -> None:
        self.sched = scheduler
        self.clock = clock
        self.limit_s = limit_s
        """Seconds a step may run (None: no limit)."""
        self.start = clock.now()
        self.step = scheduler.state.step
        """The step under watch (the core's counter moves on at its round's end)."""

    def begin(self) -> None:
        """A step starts now."""
        self.start = self.clock.now()
        self.step = self.sched.state.step

    def time_left(self) -> float | None:
        """Seconds until the step's limit (None: no limit)."""
        return None if self.limit_s is None else max(0.0, self.limit_s - (self.clock.now() - self.start))

    def is_over(self) -> bool:
        """Whether the step ran past its limit."""
        return self.limit_s is not None and self.clock.now() - self.start > self.limit_s

    def timed_out(self, pending_work: str = "") -> StepTimeout:
        return StepTimeout(f"step {self.step} ran past step_timeout_s={self.limit_s}: "
                           f"{self._pending(pending_work)}")

    def stalled(self, pending_work: str = "") -> StepStalled:
        return StepStalled(f"step {self.step} stalled at t={self.clock.now() - self.start:.3f}s of the "
                           f"step: the backend has nothing left to report and the step is not done; "
                           f"{self._pending(pending_work)}")

    def _pending(self, pending_work: str) -> str:
        running = f"{self.sched.state.num_running} requests still running"
        return f"{running}, {pending_work}" if pending_work else running
