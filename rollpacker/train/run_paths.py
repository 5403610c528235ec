"""Where a run is, and the paths it keeps.

Without --out each run of reference/train.py gets a directory of its own, runs/<date-time>, and
runs/latest is a link to the newest: `make train` runs again and again, and `--resume runs/latest`
continues the newest.  The files a run reads (--dataset, --model, a reward file, a length file) are
kept as absolute paths, so a resume from another working directory finds them, and the same file
named by another path (`data/x.jsonl`, `./data/x.jsonl`) is the same file.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

RUNS = Path("runs")
LATEST = RUNS / "latest"


def new_run_path(runs: Path = RUNS) -> Path:
    """A fresh run directory's path, runs/<date-time> (with -2, -3, ... when that name is taken);
    not created here: the trainer makes it once its flags are checked."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path, n = runs / stamp, 1
    while path.exists() or path.is_symlink():
        n += 1
        path = runs / f"{stamp}-{n}"
    return path


def link_latest(run: Path, latest: Path = LATEST) -> str | None:
    """Point `latest` at `run` (replaced in one rename, so a reader never finds it missing).  A real
    directory at `latest` (a run from before runs had their own directories) is left alone: the
    returned line says where the new run is instead."""
    if latest.exists() and not latest.is_symlink():
        return f"{latest} is a run directory of its own (kept); this run is in {run}"
    tmp = latest.with_name(f".{latest.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(os.path.relpath(run, latest.parent))
    os.replace(tmp, latest)
    return None


def followed(path: Path) -> Path:
    """`path` with a link at its end replaced by its target (runs/latest -> runs/<date-time>): a
    resumed run keeps writing where it began even when a new run moves runs/latest meanwhile."""
    if not path.is_symlink():
        return path
    target = Path(os.readlink(path))
    return target if target.is_absolute() else path.parent / target


def absolute_paths(config) -> None:
    """The run's input files as absolute paths (those that exist; a missing one stays as given, so
    its error names what was typed)."""
    from rollpacker.sim.workloads import BUILTIN

    if config.dataset is not None:
        config.dataset = _absolute(Path(config.dataset))
    if config.model:
        config.model = str(_absolute(Path(config.model)))
    if config.replay_lengths and config.replay_lengths not in BUILTIN:
        config.replay_lengths = str(_absolute(Path(config.replay_lengths)))
    module, sep, function = (config.reward or "").rpartition(":")
    if sep and module.endswith(".py"):
        config.reward = f"{_absolute(Path(module))}:{function}"


def _absolute(path: Path) -> Path:
    expanded = path.expanduser()
    return expanded.resolve() if expanded.exists() else path
