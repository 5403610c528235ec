"""What computing a group's shared prompt once saves the embedded engine: one runner, the same
prompts, `Runner.prefill` (each distinct prompt once, its cache copied to its siblings' slots)
against every row computed (`Runner._prefill_distinct` over all rows, what prefill did before).

    .venv/bin/python benchmarks/shared_prefill.py                  # print
    .venv/bin/python benchmarks/shared_prefill.py --write-results  # also update RESULTS.md

A round's admission: `--prompts` groups of `--samples` rows each, `--prompt-tokens` random ids
per prompt (the cost does not depend on them), the default model in float32 on the CPU.  The two
ways alternate, `--reps` timed calls each after one warm-up; medians.  For scale, the same run
also times `--decode-steps` decode steps of all the rows (what a short answer costs after its
prefill).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time

from cpu_flags import add_cpu_flags, apply_threads
from results_md import write_section

SECTION = "Shared prompt prefill (embedded engine)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=50)
    ap.add_argument("--decode-steps", type=int, default=12)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--model-dir", default=None, help="a local model directory (default: SmolLM2-135M-Instruct)")
    add_cpu_flags(ap)
    args = ap.parse_args()
    if min(args.prompts, args.samples, args.prompt_tokens, args.decode_steps, args.reps) < 1:
        ap.error("--prompts, --samples, --prompt-tokens, --decode-steps and --reps must be >= 1")
    import torch

    apply_threads(args)
    from rollpacker.backends.embedded.runner import Runner
    from rollpacker.backends.models import load_model

    model, _ = load_model(args.model_dir)
    rng = random.Random(0)
    groups = [[rng.randrange(model.config.vocab_size) for _ in range(args.prompt_tokens)] for _ in range(args.prompts)]
    rows = [p for p in groups for _ in range(args.samples)]
    runner = Runner(model, 0, capacity=len(rows), cols_per_slot=args.prompt_tokens + args.decode_steps + 1)
    ways = {"shared": lambda: runner.prefill(0, rows), "every row": lambda: runner._prefill_distinct(0, rows)}
    times: dict[str, list[float]] = {name: [] for name in ways}
    load = os.getloadavg()[0]
    for rep in range(args.reps + 1):
        for name in (list(ways) if rep % 2 == 0 else list(ways)[::-1]):
            t0 = time.perf_counter()
            with torch.inference_mode():  # as Runner.prefill runs
                ways[name]()
            if rep:
                times[name].append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    last = torch.zeros(len(rows), 1, dtype=torch.long)
    for step in range(args.decode_steps):
        runner.decode(last, [args.prompt_tokens + step] * len(rows))
    decode_s = time.perf_counter() - t0
    shared, every = (statistics.median(times[n]) for n in ("shared", "every row"))
    print(f"{args.prompts} prompts x {args.samples} samples, {args.prompt_tokens} prompt tokens: prefill every row "
          f"{every:.2f} s, shared {shared:.2f} s: {every / shared:.2f}x; {args.decode_steps} decode steps of the "
          f"{len(rows)} rows {decode_s:.2f} s (load {load:.1f})", flush=True)
    if args.write_results:
        write_results(args, every, shared, decode_s, load, torch.get_num_threads())


def write_results(args, every: float, shared: float, decode_s: float, load: float, threads: int) -> None:
    rows = args.prompts * args.samples
    lines = [
        f"A round's admission of {args.prompts} prompts x {args.samples} samples ({rows} rows of {args.prompt_tokens} "
        f"prompt tokens) prefilled by the embedded engine's runner: each distinct prompt once, its KV cache copied to "
        f"its siblings' slots (what `Runner.prefill` does), against every row computed (what it did before). Default "
        f"model (SmolLM2-135M-Instruct, float32), CPU: {os.cpu_count()} cores ({platform.machine()}), {threads} thread{'s' if threads != 1 else ''}; "
        f"load average {load:.1f} before.",
        "",
        f"Command: `{' '.join(['python benchmarks/shared_prefill.py', *sys.argv[1:]])}`",
        "",
        "| prefill, every row (s, median) | shared (s, median) | speed-up | "
        f"{args.decode_steps} decode steps of the {rows} rows (s) |",
        "|---|---|---|---|",
        f"| {every:.2f} | {shared:.2f} | {every / shared:.2f}x | {decode_s:.2f} |",
        "",
        f"The two ways alternate call by call ({args.reps} timed calls each), so other jobs slow both alike. The decode "
        f"column is for scale: what answers of {args.decode_steps} tokens (about the cpu fidelity setting's) cost after "
        f"their prefill, {every / (every + decode_s):.0%} of such a round before and {shared / (shared + decode_s):.0%} now.",
        "",
    ]
    write_section(SECTION, "\n".join(lines))


if __name__ == "__main__":
    main()
