"""Trainer ranks on several nodes (`torchrun --nnodes N`; one node's `--nproc` takes the same path).

Theory of operation.  Rank 0 drives the run (train/ranks.py); every rank holds a shard of the
trainer.  A state save is one DCP checkpoint that every rank writes its own shard into, at the path
rank 0 names, so the run directory must be one directory that every node sees at that path: a
shared filesystem.  Without one, each node would keep its shards to itself and a resume would find
half a checkpoint.  So before anything reads or writes the run directory, and before any model
loads, `start_ranks`:

1. creates the process group of every rank with an explicit timeout (`--dist-timeout-s`): a rank
   whose peer dies (kill -9, a lost node) sees its connections close and fails at once; a peer that
   hangs without dying fails every collective after the timeout, so no rank waits forever.  The
   followers wait inside a broadcast while rank 0 generates a round, so the timeout must exceed the
   longest step (`--step-timeout-s`);
2. checks the run directory is shared: rank 0 writes a file with a fresh token into it, every rank
   reads it through its own `--out` and through rank 0's path (the one the shards will be written
   to), and the answers are gathered, so a rank that cannot see it stops every rank with the same
   one line (never one rank failing while the others wait in a collective).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from datetime import timedelta
from pathlib import Path

from rollpacker.core.errors import ConfigError
from rollpacker.train.outputs import os_reason
from rollpacker.train.ranks import broadcast

MARKER_PREFIX = ".shared-check-"
MARKER_WAIT_S = 5.0
"""How long a rank looks for rank 0's file before calling --out unshared (NFS attribute caches)."""


def start_ranks(directory: Path, flag: str, timeout_s: float) -> None:
    """The process group of this torchrun rank, then the shared-directory check of `directory`
    (`flag` names it in the error: --out, or --resume); `timeout_s` is checked by the caller
    (RunConfig.check_dist_timeout)."""
    init_process_group(timeout_s)
    check_shared(Path(directory), flag)


def init_process_group(timeout_s: float) -> None:
    """gloo for CPU tensors (and the broadcasts of rank 0's calls), NCCL for CUDA ones when there
    is a GPU; the trainers find it made and use it."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))


def check_shared(directory: Path, flag: str) -> None:
    """Every rank sees the file rank 0 writes into `directory`, through its own path and rank 0's;
    otherwise a ConfigError on every rank, naming the first rank that does not."""
    import torch.distributed as dist

    rank = dist.get_rank()
    mine = directory.absolute()
    told = None
    if rank == 0:
        try:
            told = (_write_marker(mine), str(mine), socket.gethostname(), None)
        except OSError as exc:
            told = (None, None, None, f"{flag} {directory}: cannot write there ({os_reason(exc, mine)})")
    token, theirs, host0, error = broadcast(told)
    if error is not None:
        raise ConfigError(error)
    seen = "yes" if rank == 0 else _seen(token, mine, Path(theirs))
    answers = [None] * dist.get_world_size()
    dist.all_gather_object(answers, (rank, socket.gethostname(), seen, str(mine)))
    if rank == 0:
        (mine / (MARKER_PREFIX + token)).unlink(missing_ok=True)
    failed = [a for a in answers if a[2] != "yes"]
    if failed:
        raise ConfigError(_unshared_line(flag, theirs, host0, token, failed))


def _unshared_line(flag: str, theirs: str, host0: str, token: str, failed: list) -> str:
    rank, host, seen, path = failed[0]
    more = f" (and {len(failed) - 1} more ranks)" if len(failed) > 1 else ""
    wrote = f"{Path(theirs) / (MARKER_PREFIX + token)} on host {host0}"
    if seen == "no":
        what = f"{wrote}; rank {rank}'s {flag} {path} has no such file"
    else:
        what = f"{wrote}; rank {rank} sees it in its own {flag} {path} but not at rank 0's path, where the state " \
               f"is written: mount the share at the same path on every node"
    return (f"{flag} {theirs} is not shared between the nodes: rank {rank} on host {host}{more} cannot see the "
            f"file rank 0 wrote ({what}); give every node the same directory on a shared filesystem")


def _write_marker(directory: Path) -> str:
    token = uuid.uuid4().hex
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".tmp-{token}"
    tmp.write_text(token)
    os.replace(tmp, directory / (MARKER_PREFIX + token))  # whole or absent for the readers
    return token


def _seen(token: str, mine: Path, rank0_path: Path) -> str:
    """Whether this rank sees rank 0's file: "yes", "no" (not in its own directory), or "elsewhere"
    (in its own directory, not at rank 0's path)."""
    if not _sees(mine / (MARKER_PREFIX + token), token):
        return "no"
    if mine != rank0_path and not _sees(rank0_path / (MARKER_PREFIX + token), token):
        return "elsewhere"
    return "yes"


def _sees(path: Path, token: str) -> bool:
    deadline = time.monotonic() + MARKER_WAIT_S
    while True:
        try:
            if path.read_text() == token:
                return True
        except OSError:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
