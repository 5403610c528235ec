"""`reference/train.py --compare sync,tail --rollout sglang` against two real SGLang servers serving the
default model, written to RESULTS.md.

    make sglang   # once: the real SGLang environment
    .venv/bin/python benchmarks/sglang_compare.py [--steps 3] [--prompts 4] [--samples 4] [--max-tokens 64]
    .venv/bin/python benchmarks/sglang_compare.py --report DIR   # the section again from a run's DIR/result.json

Starts two SGLang 0.5.23 servers (on a machine without CUDA: its CPU flags, float32) serving
SmolLM2-135M-Instruct, then trains both policies from the same initial weights and seed against them,
weights sent each step in buckets over SGLang's distributed path (gloo on CPU), and records each
policy's mean step time and its stages, side by side.  Both policies run on the same servers, model,
sizes and machine: the ratio is like for like; the absolute seconds are this machine's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import statistics
import tempfile
import threading
import time
from pathlib import Path

from results_md import write_section

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
STAGES = ("rollout_s", "reward_s", "train_exposed_s", "sync_s", "step_s")


def mean(records: list[dict], key: str) -> float:
    return sum(r[key] for r in records) / len(records)


class LoadSampler:
    """The machine's 1-minute load average every `every_s` seconds while the benchmark runs: the servers and
    the trainer share these cores, so the seconds are only as good as the machine was quiet."""

    def __init__(self, every_s: float = 30.0) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every_s,), daemon=True)

    def _run(self, every_s: float) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop.wait(every_s):
                return

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def run(args: argparse.Namespace) -> dict:
    from sglang_helpers import SGLANG_HINT, sglang_python

    from rollpacker.backends.models import default_model_dir
    from rollpacker.backends.sglang.launch import launch_servers

    python = sglang_python()
    if python is None:
        raise SystemExit(SGLANG_HINT)
    model = str(default_model_dir())
    out = Path(args.out or tempfile.mkdtemp(prefix="rollpacker-sglang-compare-"))
    started = time.monotonic()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    extra = ("--max-total-tokens", str(args.kv_tokens))
    with LoadSampler() as load, launch_servers(model, num_servers=2, kind="sglang", python=python, env=env,
                                               timeout_s=1200, extra_args=extra) as group:
        ready_s = time.monotonic() - started
        print(f"2 SGLang servers ready in {ready_s:.0f} s: {group.urls}", flush=True)
        cmd = [sys.executable, str(ROOT / "reference" / "train.py"), "--compare", "sync,tail", "--out", str(out),
               "--steps", str(args.steps), "--prompts", str(args.prompts), "--samples", str(args.samples),
               "--max-tokens", str(args.max_tokens), "--seed", str(args.seed), "--rollout", "sglang",
               "--sglang-urls", *group.urls, "--weight-sync", "nccl"]
        print(" ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, cwd=ROOT)
    runs = {name: [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
            for name in ("sync", "tail")}
    result = {"args": {k: v for k, v in vars(args).items() if k != "report"}, "out": str(out), "servers_ready_s": ready_s, "load": load.samples,
              "cpus": os.cpu_count(), "machine": platform.machine(), "runs": runs}
    (out / "result.json").write_text(json.dumps(result))
    return result


def load_line(samples: list[float], cpus: int) -> str:
    if not samples:
        return "load average not sampled"
    return (f"1-minute load average sampled every 30 s while it ran: median {statistics.median(samples):.1f}, range "
            f"{min(samples):.1f}-{max(samples):.1f} on {cpus} cores (its own two servers and trainer included)")


READING = ("How to read it: the tail's short round launches more requests than sync (P' = eta * P prompts, R' samples "
           "each) and aborts what it does not keep (the wasted tokens above).  On a GPU, decode at these batch sizes is "
           "bound by reading the weights, so the extra requests ride along nearly free and the round ends at its P-th "
           "group instead of its slowest; on these CPU cores every token costs compute, so the extra tokens cost "
           "time nearly in proportion and the tail can lose.  The figure checks that both policies run end to end "
           "on real SGLang, each prompt trained once and the weights synced each step; it is not a speed-up claim "
           "(for those: the simulator's tables and the one-device GPU campaign's sync vs tail on the embedded engine).\n")


def step_rows(runs: dict) -> list[str]:
    rows = ["| policy, step | round | rollout_s | train_exposed_s | sync_s | step_s | kept / wasted tokens |",
            "|---|---|---|---|---|---|---|"]
    for name, rs in runs.items():
        rows += [f"| {name} {r['step']} | {r['round']} | {r['rollout_s']:.1f} | {r['train_exposed_s']:.1f} | "
                 f"{r['sync_s']:.1f} | {r['step_s']:.1f} | {r['kept_tokens']} / {r['wasted_tokens']} |" for r in rs]
    return rows


def report(result: dict) -> str:
    args, runs = argparse.Namespace(**result["args"]), result["runs"]
    rows = ["| policy | " + " | ".join(STAGES) + " | mean reward | trained prompts |", "|---" * (len(STAGES) + 3) + "|"]
    for name, rs in runs.items():
        rows.append(f"| {name} | " + " | ".join(f"{mean(rs, k):.1f}" for k in STAGES)
                    + f" | {mean(rs, 'mean_reward'):.3f} | {sum(r['trained_prompts'] for r in rs)} |")
    ratio = mean(runs["sync"], "step_s") / mean(runs["tail"], "step_s")
    rollout = mean(runs["sync"], "rollout_s") / mean(runs["tail"], "rollout_s")
    return (f"`benchmarks/sglang_compare.py --steps {args.steps} --prompts {args.prompts} --samples {args.samples} "
            f"--max-tokens {args.max_tokens} --seed {args.seed} --kv-tokens {args.kv_tokens}`: two real SGLang 0.5.23 servers (CPU flags, "
            f"float32) serving SmolLM2-135M-Instruct, the TorchTitan trainer, weights synced each step over "
            f"SGLang's distributed path (gloo); machine: {result['machine']}, {result['cpus']} cores; "
            f"{load_line(result['load'], result['cpus'])}. Servers ready in {result['servers_ready_s']:.0f} s. "
            f"Mean seconds per step:\n\n" + "\n".join(rows)
            + f"\n\nsync/tail: **{ratio:.2f}x** per step, {rollout:.2f}x rollout, one seed, {args.steps} steps each.\n\n"
            + "\n".join(step_rows(runs)) + "\n\n" + READING)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kv-tokens", type=int, default=4096, help="each server's KV cache (--max-total-tokens)")
    ap.add_argument("--out", default=None, help="run directory (default: a new temporary one)")
    ap.add_argument("--report", metavar="DIR", default=None,
                    help="write the section from an earlier run's DIR/result.json instead of running")
    args = ap.parse_args()
    if args.report:
        path = Path(args.report) / "result.json"
        if not path.is_file():
            raise SystemExit(f"--report {args.report}: no result.json there (the run's --out directory writes one)")
        result = json.loads(path.read_text())
    else:
        result = run(args)
    text = report(result)
    print(text)
    write_section("Sync vs tail on real SGLang servers (issue 29)", text)


if __name__ == "__main__":
    main()
