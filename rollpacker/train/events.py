"""The run's TensorBoard events (RUN_DIR/tensorboard/), kept equal to metrics.jsonl.

Every numeric field of a step's record is one scalar at that step.  A resume plays the interrupted
step again (killed mid-save, a full disk, a step whose rewards all failed): metrics.jsonl drops the
records of the steps it plays again, and `rewrite_events` rewrites the event files from the records
it keeps, so TensorBoard shows each step once, with the values metrics.jsonl holds.  Each value keeps
the wall time it was first written at (read back from the old event files), so TensorBoard's time
axes stay those of the run.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

EVENTS_DIR = "tensorboard"


def scalars(record: dict) -> Iterator[tuple[str, float]]:
    """The (tag, value) pairs of a step's record that TensorBoard plots: its numbers."""
    for key, value in record.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            yield key, value


def open_writer(path: Path):
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(path))


def rewrite_events(path: Path, records: list[dict]) -> None:
    """Replace the event files under `path` by one holding `records` alone (written beside, then
    renamed: a kill leaves the old events or the new, and the next resume rewrites them anyway)."""
    walltimes = event_walltimes(path)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    writer = open_writer(tmp)
    for record in records:
        for tag, value in scalars(record):
            writer.add_scalar(tag, value, record["step"], walltime=walltimes.get((tag, record["step"])))
    writer.close()
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)


def event_walltimes(path: Path) -> dict[tuple[str, int], float]:
    """(tag, step) -> the wall time of its last event under `path` (files in the order they were
    written: a step written again, by a run before this rewrite existed, counts its latest)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    times: dict[tuple[str, int], float] = {}
    for file in sorted(path.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(file)).Load():  # a record cut short by a kill ends the file
            for value in event.summary.value:
                times[(value.tag, event.step)] = event.wall_time
    return times
