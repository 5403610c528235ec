"""Which importer reads a log: `--format`, or told from the path's shape and first line (`auto`)."""

from __future__ import annotations

import json
from pathlib import Path

from . import own, trl, verl, wandb
from .readers import first_line
from .records import AdviseError, ImportedLog

READERS = {
    "verl": verl.read_dump,
    "verl-metrics": verl.read_metrics,
    "trl": trl.read_completions,
    "trl-state": trl.read_state,
    "wandb": wandb.read_history,
    "rollpacker": own.read_own,
}
FORMATS = ("auto", *READERS)


def read_log(path: Path, fmt: str = "auto") -> ImportedLog:
    path = Path(path)
    if not path.exists():
        raise AdviseError(f"{path}: no such file or directory (give a veRL rollout dump directory or metrics file, "
                          f"TRL's output or completions directory or trainer_state.json, a W&B history export, "
                          f"or a rollpacker metrics.jsonl)")
    if fmt == "auto":
        fmt = detect(path)
    return READERS[fmt](path)


def detect(path: Path) -> str:
    """The format of `path`, from its shape; a path of no known shape is an AdviseError naming --format."""
    found = _detect_dir(path) if path.is_dir() else _detect_file(path)
    if found is None:
        raise AdviseError(f"{path}: cannot tell its format; pass --format {'|'.join(READERS)} "
                          f"(see `rollpacker advise --help` for what each reads)")
    return found


def _detect_dir(path: Path) -> str | None:
    if any(p.stem.isdigit() for p in path.glob("*.jsonl")):
        return "verl"
    if any(path.glob("completions_*.parquet")) or any((path / "completions").glob("completions_*.parquet")):
        return "trl"
    if (path / "trainer_state.json").is_file():
        return "trl-state"
    return None


def _detect_file(path: Path) -> str | None:
    suffixes = "".join(path.suffixes)
    if path.suffix == ".csv":
        return "wandb"
    if path.suffix == ".parquet":
        return "trl" if path.name.startswith("completions_") else "wandb"
    if path.suffix == ".json":
        return _detect_json(path)
    if ".jsonl" in suffixes or path.suffix in (".log", ".txt"):
        row = first_line(path)
        if row is None:
            return None
        if "output" in row or "input" in row:
            return "verl"
        if "data" in row and "step" in row:
            return "verl-metrics"
        if "requests" in row or ("prompt" in row and "lengths" in row):
            return "rollpacker"
    return None


def _detect_json(path: Path) -> str | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if isinstance(data, dict) and "log_history" in data:
        return "trl-state"
    if isinstance(data, dict) and {"config", "steps", "total"} <= set(data):
        workload = data["config"].get("workload") if isinstance(data["config"], dict) else None
        raise AdviseError(f"{path}: a `rollpacker simulate` result holds no per-request lengths; give advise its "
                          f"workload file instead ({workload!r}; a built-in workload is the simulator's own)")
    return None
