"""A W&B run's history, exported as CSV or parquet: one row a logged step (`_step`, or the trainer's own
`step` / `train/global_step`), the same keys as the trainers log (TRL's prefixed `train/`)."""

from __future__ import annotations

from pathlib import Path

from .readers import number, read_table, step_rows
from .records import AdviseError, ImportedLog
from .trl import STATE_TIME_KEYS
from .verl import METRIC_KEYS, cap_from_scalars

STEP_COLUMNS = ("train/global_step", "step", "_step")
KEYMAPS = {"veRL": METRIC_KEYS, "TRL": STATE_TIME_KEYS}


def read_history(path: Path) -> ImportedLog:
    table = read_table(path)
    table.columns = [_unprefixed(str(c)) for c in table.columns]
    step_col = next((c for c in STEP_COLUMNS if c in table.columns), None)
    if step_col is None:
        raise AdviseError(f"{path}: no step column ({', '.join(STEP_COLUMNS)}): export the run's history with its steps")
    trainer = next((name for name, keys in KEYMAPS.items() if keys["mean"] in table.columns), None)
    if trainer is None:
        raise AdviseError(f"{path}: no column {METRIC_KEYS['mean']!r} (veRL) or {STATE_TIME_KEYS['mean']!r} (TRL, "
                          f"also as train/...): export those keys of the run's history")
    rows = []
    for record in table.to_dict("records"):
        step = number(record.get(step_col))
        if step is not None:
            rows.append((int(step), record))
    scalars, times, notes = step_rows(rows, KEYMAPS[trainer], str(path), KEYMAPS[trainer]["mean"])
    return ImportedLog(source=f"W&B history of a {trainer} run", scalars=tuple(scalars), times=tuple(times),
                       max_tokens=cap_from_scalars(scalars) if trainer == "veRL" else None, notes=tuple(notes))


def _unprefixed(column: str) -> str:
    """TRL's W&B keys carry `train/` (but `train/global_step` is the step column)."""
    if column.startswith("train/") and column != "train/global_step":
        return column[len("train/"):]
    return column
