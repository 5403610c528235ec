"""The pip extras (pyproject.toml's [project.optional-dependencies]) that bring what each command
imports beyond the core (attrs, numpy, immutables), and the one line a missing one gives:

    rollpacker simulate      core; its progress bar and --plot: rollpacker[sim]
    rollpacker advise        rollpacker[advise] (pandas and pyarrow for tables, transformers for a dump's text)
    rollpacker serve         rollpacker[serve] (torch first, the build for your device)
    reference/train.py       rollpacker[train] (torch first); --trainer titan: rollpacker[titan]
"""

from __future__ import annotations

TORCH_FIRST = "install torch first, the build for your device (pip install torch), then"


def missing_package_line(exc: ModuleNotFoundError, extra: str) -> str | None:
    """The line naming the `pip install` that brings the package `exc` misses; None when the
    missing module is part of rollpacker itself (a bug, not a missing extra)."""
    package = (exc.name or "").partition(".")[0]
    if not package or package == "rollpacker":
        return None
    how = f"pip install 'rollpacker[{extra}]'"
    if package == "torch":
        how = f"{TORCH_FIRST} {how}"
    return f"needs the Python package {package!r}, which is not installed: {how}"
