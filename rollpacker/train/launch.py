"""`reference/train.py --nproc N` on one node: the script again, as N ranks under torchrun.

Each rank says what went wrong in its own output, in one line (and torchrun logs which rank ended
with which code), so a failed rank ends the launcher with that rank's exit code (2 for bad input),
not with torchrun's traceback of its ChildFailedError, which says nothing more.

    python -m rollpacker.train.launch --nproc_per_node=N SCRIPT ARGS...   (torchrun's own flags)
"""

from __future__ import annotations

import os
import subprocess
import sys


def launch_local(nproc: int, script: str, args: list[str], env: dict[str, str]) -> int:
    """Run `script args` as `nproc` ranks on this node; the exit code of the rank that failed first,
    else 0.  OMP_NUM_THREADS defaults to 1, as torchrun sets it (without its banner saying so)."""
    cmd = [sys.executable, "-m", __name__, f"--nproc_per_node={nproc}", script, *args]
    return subprocess.call(cmd, env={"OMP_NUM_THREADS": "1", **os.environ, **env})


def main(argv: list[str]) -> int:
    """torchrun with `argv`; a rank that failed is its exit code (128 + N for a signal N)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    try:
        run(parse_args(argv))
    except ChildFailedError as exc:
        _, failure = exc.get_first_failure()
        return failure.exitcode if failure.exitcode > 0 else 128 - failure.exitcode
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
