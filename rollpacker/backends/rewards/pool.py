"""Reward scoring in worker processes, with deadlines enforced from outside.

`ProcessRewardExecutor` implements `rollpacker.core.protocols.RewardExecutor`.  Each worker is a
spawned process that runs one job at a time; a dispatcher thread in the parent hands queued jobs to
idle workers, collects outcomes, and kills any worker whose job runs past its deadline (SIGKILL: a
scorer stuck in C code ignores anything gentler), records a "timeout" outcome with reward 0, and
starts a replacement.  A scorer that raises gives "error", one that returns NaN or inf gives "nan",
both with reward 0; a worker that dies mid-job gives "error".  So every submitted job yields exactly
one outcome, no later than its deadline after a worker took it.

Each failure also has a kind, counted per step in `step_report().failures_by_kind` with the first
error of each kind (one line) in `first_errors`:

    raised       the scorer raised, SystemExit (sys.exit) included; the line names the exception
                 and the scorer's frame it came from
    bad_value    it returned something that is not a finite number (an int or a float) or a dict
                 with such a "score": None, a string (even "1.0"), a bool, NaN, inf
    timeout      it ran past its deadline; the worker was killed
    worker_died  the worker process ended mid-job (os._exit, a crash in C code, the OOM killer); the
                 line gives its exit code or signal, and a new worker takes its place

A scorer may return a float or a dict (veRL's reward functions do): the dict's "score" is the
reward and its other numeric keys are metrics, averaged over the step's "ok" outcomes in
`step_report().metrics`.  A metric's NaN or inf values are left out of its mean and counted
(`nonfinite_metrics`), the first of each metric named in one warning line.

The deadline counts from when a worker starts the job; the wait before that is reported as
`queue_s`.  A job submitted while its worker is being replaced (one killed at a deadline) waits for
the new process to start, so the pool is a `LateStartingRewardExecutor`: its `start_grace_s` (3x the
slowest worker start seen, at least `MIN_START_GRACE_S`) tells the driver how long past the core's
deadline to wait before it cuts a scoring the pool may not have started yet.  Scorers run with math-verify's own signal timeouts disabled (see `tasks.score`).
`step_report()` returns the counts and queue latency since the previous call.

The worker process and what it answers are `worker`'s; the step's counts and report are `report`'s.

A hedge (`RewardJob.copy` >= 1) runs beside the job it copies (same request id): the first outcome
of any copy is the request's one outcome (later copies' are dropped, uncounted); `cancel(request_id)`
withdraws every copy still queued or running (a running one's worker is killed and replaced, as at
a timeout): no outcome comes for a cancelled job.

If the dispatcher thread itself dies (a replacement worker cannot be started), the jobs it held end
as "error" outcomes and `submit` and `poll` then raise `RewardExecutorFailed` with the cause chained.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import signal
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import wait

from rollpacker.backends._drain import drain
from rollpacker.backends.errors import BackendMisuse, RewardExecutorFailed
from rollpacker.core.errors import ConfigError
from rollpacker.core.protocols import RewardJob, RewardOutcome

from .report import FAILURE_KINDS, RewardStepReport, StepStats, nonfinite_metrics_line
from .worker import PARENT_SIGNALS, Scorer, Worker, died_line, worker_main

__all__ = ["ProcessRewardExecutor", "RewardStepReport", "FAILURE_KINDS", "Scorer"]

MIN_START_GRACE_S = 10.0
"""The least `start_grace_s`: a worker start (a Python process importing the scorer) takes 1-3 s on
a quiet machine, several times that on a loaded one."""


class ProcessRewardExecutor:
    """Score `RewardJob`s in `num_workers` spawned processes.

    scorer: a picklable module-level function (task, entry, response) -> float; default
    `rollpacker.backends.data.tasks.score` (then unknown task names fail at submit).  warmup: run in
    each worker before it takes jobs (default: `tasks.warm_up` with the default scorer).
    """

    def __init__(
        self,
        num_workers: int = 2,
        *,
        scorer: Scorer | None = None,
        warmup: Callable[[], None] | None = None,
        start_method: str = "spawn",
    ):
        if num_workers < 1:
            raise ConfigError(f"num_workers must be >= 1, got {num_workers}")
        from rollpacker.backends.data import tasks

        self._check_task = tasks.task_spec if scorer is None else None
        if scorer is None:
            scorer, warmup = tasks.score, (tasks.warm_up if warmup is None else warmup)
        self._scorer, self._warmup = scorer, warmup
        self._ctx = mp.get_context(start_method)
        self._num_workers = num_workers
        self._lock = threading.Lock()
        self._pending: deque[tuple[RewardJob, float]] = deque()
        self._in_flight: dict[str, set[int]] = {}
        """Request id -> the copies of its job submitted and not yet answered or cancelled."""
        self._settled: set[str] = set()
        """Request ids whose first outcome went out while another copy was in flight."""
        self._cancel: set[str] = set()
        """Request ids whose jobs the dispatcher withdraws."""
        self._out: queue.Queue[RewardOutcome] = queue.Queue()
        self._stats = StepStats()
        self._warned_metrics: set[str] = set()
        """Metrics whose NaN or inf values a warning has named (once each in the executor's life)."""
        self._is_closed = False
        self._failure: BaseException | None = None  # why the dispatcher thread died
        self._wake_r, self._wake_w = self._ctx.Pipe(duplex=False)
        self._slowest_start_s = 0.0
        """The longest a worker took from its spawn to "ready"."""
        self._workers: list[Worker] = [self._spawn() for _ in range(num_workers)]
        self._thread = threading.Thread(target=self._dispatch, name="rollpacker-rewards", daemon=True)
        self._thread.start()

    # -- Protocol ---------------------------------------------------------------------------------

    def submit(self, job: RewardJob) -> None:
        if not job.deadline_s > 0:
            raise ConfigError(f"job {job.request_id!r}: deadline_s must be > 0, got {job.deadline_s}")
        if self._check_task is not None:
            self._check_task(job.task)
        self._check_dispatcher()
        with self._lock:
            if self._is_closed:
                raise BackendMisuse("the reward executor is closed")
            copies = self._in_flight.setdefault(job.request_id, set())
            if job.copy in copies:
                raise BackendMisuse(f"reward job {job.request_id!r} is already in flight (duplicate request_id)")
            copies.add(job.copy)
            self._pending.append((job, time.monotonic()))
        self._wake_w.send_bytes(b"j")

    def poll(self, timeout: float | None = None) -> list[RewardOutcome]:
        """Outcomes since the last poll; waits up to `timeout` for the first (None: until one
        arrives, or [] at once when nothing is in flight)."""
        outcomes = drain(self._out, timeout, lambda: self.num_in_flight == 0 or self._failure is not None)
        if not outcomes:
            self._check_dispatcher()
        return outcomes

    def cancel(self, request_id: str) -> None:
        """Withdraw every copy of `request_id` still queued or running: none gives an outcome (a
        running one's worker is killed and replaced).  A copy already answered is unaffected."""
        with self._lock:
            if request_id not in self._in_flight:
                return
            self._cancel.add(request_id)
        self._wake_w.send_bytes(b"x")

    def _check_dispatcher(self) -> None:
        if self._failure is not None:
            raise RewardExecutorFailed("the reward executor's dispatcher thread died; no job is scored "
                                       "any more") from self._failure

    def close(self) -> None:
        with self._lock:
            if self._is_closed:
                return
            self._is_closed = True
        self._wake_w.send_bytes(b"c")
        self._thread.join(timeout=30)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def start_grace_s(self) -> float:
        """How late a submitted job may start (LateStartingRewardExecutor): 3x the slowest worker
        start seen, at least MIN_START_GRACE_S."""
        return max(MIN_START_GRACE_S, 3 * self._slowest_start_s)

    @property
    def num_in_flight(self) -> int:
        with self._lock:
            return len(self._in_flight)

    def step_report(self) -> RewardStepReport:
        """Counts and latencies since the previous report (then reset).  The first NaN or inf value
        of each metric is one warning line on stderr; all of them are counted in the report."""
        with self._lock:
            s, self._stats = self._stats, StepStats()
        report = s.report()
        new = {key: n for key, n in report.nonfinite_metrics.items() if key not in self._warned_metrics}
        if new:
            self._warned_metrics.update(new)
            print(nonfinite_metrics_line(new), file=sys.stderr, flush=True)
        return report

    # -- dispatcher thread ------------------------------------------------------------------------

    def _spawn(self) -> Worker:
        try:
            parent, child = self._ctx.Pipe()
            proc = self._ctx.Process(
                target=worker_main, args=(child, self._scorer, self._warmup), name="rollpacker-reward", daemon=True
            )
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, set(PARENT_SIGNALS))  # inherited through exec
            try:
                proc.start()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        except OSError as exc:  # out of processes, memory or file descriptors
            raise RewardExecutorFailed(f"could not start a reward worker process ({exc})") from exc
        child.close()
        return Worker(proc, parent, spawned=time.monotonic())

    def _dispatch(self) -> None:
        failure = None
        try:
            while True:
                with self._lock:
                    if self._is_closed:
                        break
                self._assign()
                now = time.monotonic()
                deadlines = [w.job_started + w.job.deadline_s - now for w in self._workers if w.job is not None]
                wait_s = min([0.5] + [max(0.0, d) for d in deadlines])
                ready = wait([w.conn for w in self._workers] + [self._wake_r], timeout=wait_s)
                if self._wake_r in ready:
                    while self._wake_r.poll():
                        self._wake_r.recv_bytes()
                for w in list(self._workers):
                    if w.conn in ready:
                        self._receive(w)
                self._withdraw()
                self._enforce_deadlines()
        except BaseException as exc:  # surfaced by submit and poll, once every held job has its outcome
            failure = exc
            traceback.print_exc()
        try:
            self._shutdown()
        except BaseException as exc:  # (out of descriptors, say): still surfaced, never a silent hang
            failure = failure or exc
            traceback.print_exc()
        self._failure = failure

    def _assign(self) -> None:
        for w in self._workers:
            if not w.is_ready or w.job is not None:
                continue
            with self._lock:
                if not self._pending:
                    return
                job, submitted = self._pending.popleft()
            w.job, w.job_submitted, w.job_started = job, submitted, time.monotonic()
            try:
                w.conn.send((job.request_id, job.task, job.entry, job.response))
            except (OSError, ValueError):  # broken pipe: the worker died
                self._replace_dead(w)

    def _receive(self, w: Worker) -> None:
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):
            self._replace_dead(w)
            return
        if msg[0] == "ready":
            w.is_ready = True
            self._slowest_start_s = max(self._slowest_start_s, time.monotonic() - w.spawned)
            return
        job_id, status, kind, reward, error, latency, metrics = msg
        job, w.job = w.job, None
        if job is not None and job.request_id == job_id:
            self._record(job, w.job_started - w.job_submitted, status, reward, error, latency, metrics, kind)

    def _replace_dead(self, w: Worker) -> None:
        w.process.join(timeout=5)  # reap it, so its exit code is known
        self._replace(w, "error", "worker_died", died_line(w.process.exitcode))

    def _withdraw(self) -> None:
        """Drop the cancelled jobs: queued ones from the queue, running ones with their worker."""
        with self._lock:
            cancel, self._cancel = self._cancel, set()
            if not cancel:
                return
            self._pending = deque(p for p in self._pending if p[0].request_id not in cancel)
        for w in list(self._workers):
            if w.job is not None and w.job.request_id in cancel:
                w.job = None
                self._replace(w, "error", "", "")
        with self._lock:  # (last: no job in flight means its worker was replaced)
            for rid in cancel:
                self._in_flight.pop(rid, None)
                self._settled.discard(rid)

    def _enforce_deadlines(self) -> None:
        now = time.monotonic()
        for w in list(self._workers):
            if w.job is not None and now - w.job_started > w.job.deadline_s:
                self._replace(w, "timeout", "timeout", f"scorer ran past its {w.job.deadline_s:g} s deadline; worker killed")

    def _replace(self, w: Worker, status: str, kind: str, error: str) -> None:
        """Kill `w`, record its job (if any) as failed, and start a new worker in its place."""
        w.process.kill()
        w.process.join(timeout=5)
        w.conn.close()
        if w.job is not None:
            latency = w.job.deadline_s if status == "timeout" else time.monotonic() - w.job_started
            self._record(w.job, w.job_started - w.job_submitted, status, 0.0, error, latency, kind=kind)
        self._workers.remove(w)
        with self._lock:
            self._stats.replaced += 1
            is_closed = self._is_closed
        if not is_closed:
            self._workers.append(self._spawn())

    def _record(self, job: RewardJob, queue_s: float, status: str, reward: float, error: str, latency: float,
                metrics: dict[str, float] | None = None, kind: str = "") -> None:
        with self._lock:
            if not self._first_outcome(job):
                return
            self._stats.count(status, kind, error, metrics or {}, queue_s, latency)
        self._out.put(RewardOutcome(job.request_id, reward, status, latency_s=latency, queue_s=queue_s, error=error,
                                    copy=job.copy))

    def _first_outcome(self, job: RewardJob) -> bool:
        """Mark `job`'s copy answered (under the lock); False when another copy's outcome went out
        first: one outcome per request id, counted once."""
        rid, copies = job.request_id, self._in_flight.get(job.request_id, set())
        copies.discard(job.copy)
        first = rid not in self._settled
        if copies:
            self._settled.add(rid)
        else:
            self._in_flight.pop(rid, None)
            self._settled.discard(rid)
        return first

    def _shutdown(self) -> None:
        """Stop every worker; jobs still queued or running end as errors so none is lost."""
        for w in self._workers:
            try:
                w.conn.send(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 2.0
        for w in self._workers:
            w.process.join(timeout=max(0.0, deadline - time.monotonic()))
            if w.process.is_alive():
                w.process.kill()
                w.process.join(timeout=5)
            if w.job is not None:
                self._record(w.job, w.job_started - w.job_submitted, "error", 0.0, "executor closed", 0.0)
            w.conn.close()
        with self._lock:
            pending, self._pending = list(self._pending), deque()
        for job, submitted in pending:
            self._record(job, time.monotonic() - submitted, "error", 0.0, "executor closed before scoring", 0.0)
        self._workers = []
