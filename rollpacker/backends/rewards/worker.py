"""A reward worker: the process that scores one job at a time (`worker_main`), what it answers for
each (`score_job`: ok, or a failure's kind and one line), and the parent's handle of it (`Worker`)."""

from __future__ import annotations

import math
import signal
import time
import traceback
from collections.abc import Callable
from typing import Any

from attrs import define

from rollpacker.backends.rewards.functions import split_result
from rollpacker.core.protocols import RewardJob

Scorer = Callable[[str, Any, str], Any]
"""(task, entry, response) -> float, or a dict with "score" and metrics."""

PARENT_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""Signals a worker ignores: the parent handles them and closes its workers."""


def worker_main(conn, scorer: Scorer, warmup: Callable[[], None] | None) -> None:
    # Ctrl-C (and a SIGTERM sent to the process group) reaches every process; the parent owns it
    # and closes its workers, so a worker stays quiet (the parent started it with both blocked;
    # ignore them, then unblock).
    for sig in PARENT_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(PARENT_SIGNALS))
    if warmup is not None:
        warmup()
    conn.send(("ready",))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        job_id, task, entry, response = msg
        start = time.perf_counter()
        status, kind, reward, metrics, error = score_job(scorer, task, entry, response)
        conn.send((job_id, status, kind, reward, error, time.perf_counter() - start, metrics))


def score_job(scorer: Scorer, task: str, entry: Any, response: str) -> tuple[str, str, float, dict, str]:
    """(status, failure kind or "", reward, metrics, error) of one job, in the worker."""
    try:
        result = scorer(task, entry, response)
    except BaseException as exc:  # noqa: BLE001 - any scorer failure (sys.exit too) is a recorded outcome
        return "error", "raised", 0.0, {}, raised_line(exc)
    try:
        reward, metrics = split_result(result)
    except (TypeError, ValueError) as exc:
        return "error", "bad_value", 0.0, {}, f"the scorer returned {_short(result)}: {exc}"[:500]
    if not math.isfinite(reward):
        return "nan", "bad_value", 0.0, {}, f"the scorer returned {_short(result)}, not a finite number"
    return "ok", "", reward, metrics, ""


def raised_line(exc: BaseException) -> str:
    """`Type: message (at file:line in function)`: a traceback's last line and its innermost frame."""
    line = f"{type(exc).__name__}: {exc}".splitlines()[0][:400]
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        frame = frames[-1]
        line += f" (at {frame.filename}:{frame.lineno} in {frame.name})"
    return line


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def died_line(exitcode: int | None) -> str:
    """Why a worker process ended mid-job, from its exit code."""
    if exitcode is not None and exitcode < 0:
        try:
            how = f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            how = f"was killed by signal {-exitcode}"
    else:
        how = f"exited with code {exitcode}"
    return f"the reward worker process {how} while scoring (os._exit, a crash in C code, or the OOM killer)"


@define(eq=False)
class Worker:
    """The parent's handle of one worker process and the job it runs."""

    process: Any
    conn: Any
    is_ready: bool = False
    job: RewardJob | None = None
    job_submitted: float = 0.0
    job_started: float = 0.0
    spawned: float = 0.0
    """When the process was started (time.monotonic): its start lasts until it says "ready"."""
