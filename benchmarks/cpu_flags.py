"""The flags the model micro-benchmarks share: torch's CPU threads and writing RESULTS.md."""

from __future__ import annotations

import argparse

THREADS_HELP = ("torch's intra-op threads (default: torch's; 1 on a machine other jobs load, where two threads per "
                "process wait on each other's cores)")


def add_cpu_flags(ap: argparse.ArgumentParser) -> None:
    """--threads and --write-results."""
    ap.add_argument("--threads", type=int, default=None, help=THREADS_HELP)
    ap.add_argument("--write-results", action="store_true", help="write this benchmark's section of RESULTS.md")


def apply_threads(args: argparse.Namespace) -> None:
    """torch's intra-op threads as --threads says (nothing when it is not given)."""
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
