"""What running the LM head at response positions only saves: one trainer, the same weights and
micro-batches, `response_logits_only` on and off in turn (the flag is read at each forward).

    .venv/bin/python benchmarks/response_logits.py                  # both trainers, print
    .venv/bin/python benchmarks/response_logits.py --write-results  # also update RESULTS.md

For each trainer (TorchTitan's, plain PyTorch's) and each micro-batch shape, `--reps` timed
forward+backward calls per setting, alternating (so the machine's load falls on both alike), after
one warm-up each; the ratio is median(head everywhere) / median(response only).  The FLOPs of each
setting come from torch's FLOP counter on one call: exact, and what the time should follow where
the matmuls dominate.  Random token ids: the cost does not depend on them.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time

import attrs

from cpu_flags import add_cpu_flags, apply_threads
from results_md import write_section

SECTION = "Response-only LM head (trainer forward+backward)"
SHAPES = {"short": (8, 50, 12), "long": (2, 50, 200)}  # rows, prompt, response tokens
"""short: the cpu fidelity setting's micro-batches (about 8 rows of a 50-token arithmetic prompt and
a 10-token answer); long: a 256-response-token micro-batch of two 200-token answers."""


def build(kind: str, model_dir: str):
    if kind == "titan":
        from rollpacker.backends.titan.config import TitanConfig
        from rollpacker.backends.titan.trainer import TitanTrainer

        return TitanTrainer(TitanConfig(model_dir=model_dir, lr=1e-6, device="cpu"))
    from rollpacker.backends.trainer.pytorch import TorchTrainer, TorchTrainerConfig

    return TorchTrainer(TorchTrainerConfig(model_dir=model_dir, lr=1e-6, device="cpu"))


def micro_batch(trainer, shape: tuple[int, int, int], rng: random.Random):
    from rollpacker.core.protocols import MicroBatch, TrainSample

    rows, prompt, response = shape
    return MicroBatch(tuple(
        TrainSample(tuple(rng.randrange(trainer.vocab_size) for _ in range(prompt)),
                    tuple(rng.randrange(trainer.vocab_size) for _ in range(response)),
                    advantage=rng.uniform(-1, 1), token_weight=1.0)
        for _ in range(rows)))


def measure(trainer, batch, reps: int) -> dict:
    """Seconds per call and FLOPs of each setting on `batch`, alternating the setting."""
    from torch.utils.flop_counter import FlopCounterMode

    base = trainer.config
    times: dict[bool, list[float]] = {True: [], False: []}
    flops: dict[bool, int] = {}
    for rep in range(reps + 1):
        for only in (True, False) if rep % 2 == 0 else (False, True):
            trainer.config = attrs.evolve(base, response_logits_only=only)
            if rep == 0:  # warm-up, counted
                counter = FlopCounterMode(display=False)
                with counter:
                    trainer.forward_backward(batch)
                flops[only] = counter.get_total_flops()
            else:
                t0 = time.perf_counter()
                trainer.forward_backward(batch)
                times[only].append(time.perf_counter() - t0)
            trainer.discard_gradients()
    trainer.config = base
    on, off = statistics.median(times[True]), statistics.median(times[False])
    return {"response_s": on, "everywhere_s": off, "time_ratio": off / on, "flop_ratio": flops[False] / flops[True],
            "response_s_all": times[True], "everywhere_s_all": times[False]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trainers", default="titan,torch")
    ap.add_argument("--shapes", default="short,long")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--model-dir", default=None, help="default: the default model (SmolLM2-135M-Instruct)")
    add_cpu_flags(ap)
    args = ap.parse_args()
    unknown = [s for s in args.shapes.split(",") if s not in SHAPES]
    if unknown or args.reps < 1:
        ap.error(f"--shapes must be among {', '.join(SHAPES)} and --reps >= 1, got {args.shapes!r} and {args.reps}")
    import torch

    apply_threads(args)
    from rollpacker.backends.models import default_model_dir

    model_dir = args.model_dir or str(default_model_dir())
    rows = []
    for kind in args.trainers.split(","):
        trainer = build(kind, model_dir)
        for name in args.shapes.split(","):
            load = os.getloadavg()[0]
            result = measure(trainer, micro_batch(trainer, SHAPES[name], random.Random(0)), args.reps)
            rows.append({"trainer": kind, "shape": name, "load": load, **result})
            print(f"{kind:5} {name:5} {SHAPES[name]}: head everywhere {result['everywhere_s']:.2f} s, response only "
                  f"{result['response_s']:.2f} s: {result['time_ratio']:.2f}x (FLOPs {result['flop_ratio']:.2f}x; "
                  f"load {load:.1f})", flush=True)
        trainer.close()
    if args.write_results:
        write_results(rows, sys.argv[1:], torch.get_num_threads())


def write_results(rows: list[dict], flags: list[str], threads: int) -> None:
    lines = [
        f"The LM head at response positions only (`response_logits_only`, the default) against the head at every "
        f"position, on one trainer with the same weights and micro-batches, alternating; default model "
        f"(SmolLM2-135M-Instruct, float32), CPU: {os.cpu_count()} cores ({platform.machine()}), {threads} "
        f"thread{'s' if threads != 1 else ''}.",
        "",
        f"Command: `{' '.join(['python benchmarks/response_logits.py', *flags])}`",
        "",
        "| trainer | micro-batch (rows x prompt + response) | head everywhere, s (median) | response only, s | "
        "speed-up | FLOPs ratio | load avg before |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        n, p, a = SHAPES[r["shape"]]
        lines.append(f"| {r['trainer']} | {n} x ({p} + {a}) | {r['everywhere_s']:.2f} | {r['response_s']:.2f} | "
                     f"{r['time_ratio']:.2f}x | {r['flop_ratio']:.2f}x | {r['load']:.1f} |")
    lines += ["", "Each time is the median of the timed calls of its setting; the two settings alternate call by call, "
                  "so other jobs on the machine slow both alike. The FLOPs ratio is exact (torch's FLOP counter); the "
                  "time also sheds the softmax over the vocabulary at prompt positions (memory-bound work the FLOP "
                  "counter does not see), so it may gain a little more.", ""]
    write_section(SECTION, "\n".join(lines))


if __name__ == "__main__":
    main()
