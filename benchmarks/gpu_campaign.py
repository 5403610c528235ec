"""One command on a GPU machine: the engine, the trainer and the reference trainer's policies, all on
one device, written to RESULTS.md.

    .venv/bin/python benchmarks/gpu_campaign.py                    # on a GPU: everything on cuda
    .venv/bin/python benchmarks/gpu_campaign.py --device cpu --tiny --model DIR --results /tmp/R.md

Three parts, each in its own process so one's memory is free before the next:

1. engine: benchmarks/engine_throughput.py (the embedded engine vs static `generate`, decode-step
   profile on CUDA) with the engine on --device;
2. trainer: forward+backward tokens/s of the trainer `--trainer` picks (TorchTitan's when it
   imports, else the plain-PyTorch trainer: TorchTitan needs torch >= 2.13, the lent GPU machines
   have 2.11), on micro-batches of random ids;
3. policies: `reference/train.py --compare sync,tail,sorted,partial --device ...` from the same
   weights and seed; the step-time ratio sync/policy is the speed-up.

Writes the `## One-device campaign (<device>)` section of --results, one `###` subsection per part,
each naming the device, the torch version and the exact command.  --tiny shrinks every size for a
smoke run on a CPU (use with a tiny model, e.g. rollpacker.backends.models.tiny_random_llama).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results_md import RESULTS, write_section  # noqa: E402

# (full, tiny) sizes of each part
# full: sized for an 80 GB GPU and SmolLM2-135M, untimed there yet; transformers' continuous
# batching is left out of the engine part to bound the campaign's time (engine_throughput.py runs it)
ENGINE_SIZES = {"full": ["--requests", "256", "--cap", "1024", "--batch", "128", "--skip-hf-cb"],
                "tiny": ["--requests", "4", "--cap", "8", "--batch", "4", "--skip-hf-cb", "--repeats", "1"]}
TRAINER_SIZES = {"full": dict(batch=8, prompt=256, response=768, iters=5), "tiny": dict(batch=2, prompt=8, response=8, iters=2)}
TRAIN_SIZES = {"full": ["--steps", "6", "--prompts", "16", "--samples", "8", "--max-tokens", "1024",
                        "--engine-capacity", "256", "--micro-batch-tokens", "8192", "--dataset-size", "512"],
               "tiny": ["--preset", "tiny_debug", "--steps", "1"]}


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="auto: cuda when available")
    ap.add_argument("--trainer", default="auto", choices=("auto", "titan", "torch"),
                    help="auto: titan when TorchTitan imports, else torch (said so in the output)")
    ap.add_argument("--model", default=None, help="HF model directory (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--dtype", default=None, choices=("float32", "bfloat16"), help="default: bfloat16 on cuda, else float32")
    ap.add_argument("--policies", default="sync,tail,sorted,partial", help="--compare list; the first is the baseline")
    ap.add_argument("--tiny", action="store_true", help="tiny sizes: a CPU smoke run of every part")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "gpu_campaign", help="run directory (replaced)")
    ap.add_argument("--results", type=Path, default=RESULTS, help="RESULTS.md to write the section into")
    return ap.parse_args(argv)


def pick_trainer(wanted: str) -> tuple[str, str]:
    """(trainer, why) for --trainer; auto falls back to the torch trainer when TorchTitan cannot import."""
    from rollpacker.backends.titan.trainer import titan_import_error

    problem = titan_import_error()
    if wanted == "titan" and problem is not None:
        raise SystemExit(f"error: --trainer titan: {problem}")
    if wanted != "auto":
        return wanted, f"--trainer {wanted}"
    if problem is None:
        return "titan", "TorchTitan imports"
    return "torch", f"TorchTitan unavailable ({problem}): using --trainer torch"


def run_engine(args: argparse.Namespace, size: str) -> dict:
    cmd = [sys.executable, "benchmarks/engine_throughput.py", "--device", args.device, "--dtype", args.dtype,
           *(["--model", args.model] if args.model else []), *ENGINE_SIZES[size]]
    proc = subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, text=True)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return {**result, "command": _shown(cmd)}


def run_policies(args: argparse.Namespace, size: str) -> dict:
    out = args.out / "compare"
    shutil.rmtree(out, ignore_errors=True)  # --compare writes fresh runs
    cmd = [sys.executable, "reference/train.py", *TRAIN_SIZES[size], "--compare", args.policies, "--device", args.device,
           "--trainer", args.trainer, "--dtype", args.dtype, "--out", str(out),
           *(["--model", args.model] if args.model else [])]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"error: {_shown(cmd)} failed:\n{proc.stderr[-3000:]}")
    plan = next((line for line in proc.stdout.splitlines() if line.startswith("memory plan")), "")
    peaks = [json.loads(line).get("cuda_peak_gib") for p in args.policies.split(",")
             for line in (out / p.strip() / "metrics.jsonl").read_text().splitlines()]
    peak = max((x for x in peaks if x is not None), default=None)
    return {**json.loads((out / "compare.json").read_text()), "command": _shown(cmd), "memory_plan": plan,
            "cuda_peak_gib": peak}


def run_trainer(args: argparse.Namespace, size: str) -> dict:
    """Forward+backward of the run's trainer in a child process (its memory is freed on exit)."""
    sizes = TRAINER_SIZES[size]
    cmd = [sys.executable, "benchmarks/gpu_campaign.py", "--trainer-worker", json.dumps(
        dict(sizes, model=args.model, trainer=args.trainer, device=args.device, dtype=args.dtype))]
    proc = subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, text=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def trainer_worker(spec: dict) -> dict:
    import random

    import torch

    from rollpacker.backends.models import resolve_model
    from rollpacker.core.protocols import MicroBatch, TrainSample
    from rollpacker.train.config import RunConfig
    from rollpacker.train.session import build_trainer

    config = RunConfig(model=spec["model"], trainer=spec["trainer"], device=spec["device"], dtype=spec["dtype"], lr=1e-6)
    trainer = build_trainer(config, resolve_model(spec["model"]))
    vocab, rng = trainer.vocab_size, random.Random(0)
    sync = torch.cuda.synchronize if spec["device"] == "cuda" else (lambda: None)

    def micro_batch() -> MicroBatch:
        ids = lambda n: tuple(rng.randrange(vocab) for _ in range(n))  # noqa: E731
        return MicroBatch(tuple(TrainSample(ids(spec["prompt"]), ids(spec["response"]), rng.uniform(-1, 1), 1.0)
                                for _ in range(spec["batch"])))

    trainer.forward_backward(micro_batch())  # warm-up
    times = []
    for _ in range(spec["iters"]):
        batch = micro_batch()
        sync()
        start = time.perf_counter()
        trainer.forward_backward(batch)
        sync()
        times.append(time.perf_counter() - start)
    tokens = spec["batch"] * (spec["prompt"] + spec["response"])
    best, median = min(times), sorted(times)[len(times) // 2]
    return {**spec, "trainer_class": type(trainer).__name__, "tokens_per_s": round(tokens / median, 1),
            "best_tokens_per_s": round(tokens / best, 1), "fwd_bwd_s": [round(t, 3) for t in times]}


def device_name(device: str) -> str:
    import torch

    if device == "cuda":
        return torch.cuda.get_device_name()
    return f"cpu ({platform.machine()}, {__import__('os').cpu_count()} cores)"


def engine_body(r: dict, header: str) -> str:
    rows = [("rollpacker embedded engine", r["embedded_tok_s"], r["embedded_vs_static"]),
            ("static `generate` (padded batches)", r["static_tok_s"], 1.0)]
    if r.get("hf_cb_tok_s") is not None:
        rows.append(("transformers continuous batching", r["hf_cb_tok_s"], r["hf_cb_vs_static"]))
    lines = [header, "", f"Command: `{r['command']}`", "",
             f"{r['num_requests']} requests, cap {r['cap']} new tokens, capacity {r['batch']}, {r['dtype']}; "
             f"lengths {r['lengths']}.", "", "| engine | tokens/s | vs static |", "|---|---|---|"]
    lines += [f"| {name} | {tok_s} | {ratio}x |" for name, tok_s, ratio in rows]
    if "decode_step" in r:
        d = r["decode_step"]
        lines += ["", f"Decode step at {d['rows']} rows x {d['context']} tokens: {d['graph_ms']} ms with CUDA graphs, "
                      f"{d['eager_ms']} ms eager; memory floor {d['memory_floor_ms']} ms."]
    return "\n".join(lines)


def trainer_body(r: dict, header: str, command: str) -> str:
    return "\n".join([
        header, "", f"Command: `{command}` (its trainer part)", "",
        f"`{r['trainer_class']}` forward+backward, {r['dtype']}, micro-batches of {r['batch']} x "
        f"({r['prompt']} prompt + {r['response']} response) random tokens, {r['iters']} timed:", "",
        "| tokens/s (median) | best | seconds per micro-batch |", "|---|---|---|",
        f"| {r['tokens_per_s']} | {r['best_tokens_per_s']} | {', '.join(map(str, r['fwd_bwd_s']))} |"])


def policies_body(s: dict, header: str) -> str:
    base = s["policies"][0]
    peak = "" if s["cuda_peak_gib"] is None else f" Measured peak CUDA memory allocated: {s['cuda_peak_gib']} GiB."
    lines = [header, "", f"Command: `{s['command']}`", "", f"`{s['memory_plan']}`{peak}", "",
             f"| policy | mean step s | {base}/policy step time | bubble ratio | mean reward | on-policy token fraction |",
             "|---|---|---|---|---|---|"]
    for p in s["policies"]:
        ratio = 1.0 if p == base else s["step_time_ratio"][p]
        lines.append(f"| {p} | {s['mean_step_s'][p]:.2f} | {ratio:.2f}x | {s['bubble_ratio'][p]:.2f} | "
                     f"{s['mean_reward'][p]:.3f} | {s['on_policy_token_fraction'][p]:.3f} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--trainer-worker"]:
        print(json.dumps(trainer_worker(json.loads(argv[1]))))
        return 0
    args = parse_args(argv)
    import torch

    from rollpacker.core.errors import ConfigError
    from rollpacker.train.config import resolve_device

    try:
        args.device = resolve_device(args.device)
    except ConfigError as exc:
        raise SystemExit(f"error: {exc}") from None
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    args.trainer, why = pick_trainer(args.trainer)
    size = "tiny" if args.tiny else "full"
    name = device_name(args.device)
    command = _shown([sys.executable, "benchmarks/gpu_campaign.py", *argv])
    header = f"On {name}, torch {torch.__version__}, trainer {args.trainer} ({why}), {args.dtype}."
    print(f"campaign on {name}: trainer {args.trainer} ({why}); results into {args.results}", flush=True)
    title = f"One-device campaign ({name})"
    parts = [("Embedded engine", lambda: engine_body(run_engine(args, size), header)),
             ("Trainer", lambda: trainer_body(run_trainer(args, size), header, command)),
             (f"Reference trainer: {args.policies.replace(',', ' vs ')}", lambda: policies_body(run_policies(args, size), header))]
    for subsection, run in parts:
        print(f"== {subsection} ==", flush=True)
        body = run()
        write_section(title, body, subsection=subsection, path=args.results)
        print(body, flush=True)
    return 0


def _shown(cmd: list[str]) -> str:
    """A command as a reader would type it: the interpreter as `python`."""
    return " ".join(["python", *cmd[1:]] if cmd and cmd[0] == sys.executable else cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
