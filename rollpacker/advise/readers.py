"""Reading log files: JSON lines (plain or gzipped), tables (CSV, parquet), and step-scalar rows.

Each problem is an `AdviseError` naming the file (and line) and what it expected."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

from rollpacker.sim.workloads import json_object, text_lines

from .records import AdviseError, StepScalars, StepTimes


def json_lines(path: Path, shape: str) -> Iterator[tuple[int, dict]]:
    """(line number, object) of each non-blank line (plain or gzipped); `shape` says what a line should be,
    in errors."""
    for lineno, line in text_lines(path, shape, AdviseError):
        row = json_object(line, f"{path}:{lineno}", shape, AdviseError)
        yield lineno, row


def first_line(path: Path) -> dict | None:
    """The first JSON object of a JSON-lines file, None when it is not one."""
    try:
        found = next(json_lines(path, "JSON lines"), None)
    except AdviseError:
        return None
    return None if found is None else found[1]


def read_table(path: Path):
    """A CSV or parquet file as a pandas DataFrame."""
    import pandas as pd

    try:
        if path.suffix == ".parquet":
            return pd.read_parquet(path)
        return pd.read_csv(path)
    except (ValueError, OSError) as exc:
        kind = "parquet" if path.suffix == ".parquet" else "CSV"
        raise AdviseError(f"{path}: not a readable {kind} file ({str(exc).splitlines()[0]})") from None


def number(value) -> float | None:
    """A finite number, or None (absent, NaN, text)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(value)
        except (TypeError, ValueError):
            return None
    value = float(value)
    return value if math.isfinite(value) else None


LENGTH_FIELDS = ("mean", "max", "min", "clip_ratio", "prompt_mean")
TIME_FIELDS = ("gen_s", "step_s", "agent_max", "agent_mean")


def step_rows(rows: list[tuple[int, dict]], keys: dict[str, str], where: str, needed: str) -> tuple[list, list, list]:
    """StepScalars and StepTimes of (step, {key: value}) rows, by `keys` (field -> log key; a key may be a
    callable picking a value from the row); rows without a mean length are skipped and counted (a logger
    writes other rows too: evaluation, the end of training).  `needed` names the mean's key in errors."""
    scalars, times, skipped = [], [], 0
    for step, row in rows:
        values = {name: number(key(row) if callable(key) else row.get(key)) for name, key in keys.items()}
        if values.get("mean") is None:
            skipped += 1
            continue
        scalars.append(StepScalars(step, **{k: values.get(k) for k in LENGTH_FIELDS}))
        times.append(StepTimes(step, **{k: values.get(k) for k in TIME_FIELDS}))
    if not scalars:
        raise AdviseError(f"{where}: no row holds {needed!r} (the mean response length of a step); "
                          f"is this the training run's log?")
    notes = [f"{skipped} rows without {needed!r} skipped (not training steps)"] if skipped else []
    return scalars, times, notes
