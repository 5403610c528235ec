"""What the plugin tests share: the folder of the tests' plugin module (tests/plugins/my_plugin.py:
policy foo, rollout engine counting, trainer loud) and the fresh interpreters they run the CLIs in."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "reference" / "train.py"
PLUGINS = Path(__file__).resolve().parent / "plugins"


def plugin_env(folder: Path, modules: str | None) -> dict:
    """The environment of a CLI that imports plugins from `folder` and tests/plugins, loading
    `modules` (None: ROLLPACKER_PLUGINS unset)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, (folder, PLUGINS, ROOT)))}
    env.pop("ROLLPACKER_PLUGINS", None)
    return env if modules is None else env | {"ROLLPACKER_PLUGINS": modules}


def run(args, env: dict, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env=env)


def simulate(*args) -> list[str]:
    """The arguments of `python` that run `rollpacker simulate ARGS`."""
    return ["-c", "import sys; from rollpacker.cli import main; sys.exit(main())", "simulate", *args]
