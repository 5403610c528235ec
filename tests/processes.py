"""The processes of this machine as /proc shows them (Linux): for the tests that kill a whole node or
measure what an idle server costs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path


def process_stats() -> Iterator[tuple[int, list[str]]]:
    """(pid, the fields of /proc/PID/stat after the command name) of every process: fields[0] is
    the state, [1] the parent's PID, [3] the session, [11] and [12] the user and system CPU ticks."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        yield int(stat.parent.name), fields


def children(pid: int) -> list[int]:
    """The PIDs of `pid`'s child processes."""
    return [child for child, fields in process_stats() if int(fields[1]) == pid]


def session_cpu_seconds(session: int) -> float:
    """The CPU time (user + system) the live processes of `session` have used so far."""
    ticks = sum(int(f[11]) + int(f[12]) for _, f in process_stats() if int(f[3]) == session)
    return ticks / os.sysconf("SC_CLK_TCK")
