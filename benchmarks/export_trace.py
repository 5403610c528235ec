"""Export a training run's per-prompt sample lengths as a simulator workload.

    .venv/bin/python benchmarks/export_trace.py runs/latest/metrics.jsonl trace.jsonl
    .venv/bin/rollpacker simulate --workload trace.jsonl --max-tokens 512 ...

One line per (step, prompt): {"step", "prompt", "lengths", "finish_reasons", "aborted"}.
"""

from __future__ import annotations

import argparse
import sys

from rollpacker.sim.workloads import WorkloadError, export_trace


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("metrics", help="RUN_DIR/metrics.jsonl of a reference/train.py run")
    ap.add_argument("out", help="workload JSONL to write")
    args = ap.parse_args()
    try:
        n = export_trace(args.metrics, args.out)
    except WorkloadError as exc:
        print(f"export_trace: error: {exc}", file=sys.stderr)
        return 2
    print(f"{n} (step, prompt) lines -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
