"""Forward+backward throughput of the TorchTitan trainer on the default model.

    .venv/bin/python benchmarks/titan_throughput.py                 # 1 and 2 processes, print
    .venv/bin/python benchmarks/titan_throughput.py --write-results # also update RESULTS.md

Each run builds a TitanTrainer on the default model (SmolLM2-135M-Instruct from
rollpacker.backends.models; a random model of the same shape if that is unavailable), warms up on
one micro-batch, then times `--iters` calls of forward_backward on micro-batches of `--batch`
samples of `--prompt` + `--response` tokens (random ids, loss over the response).  tokens/s counts
every token the forward sees (prompt + response) summed over ranks; the optimizer step is timed
separately.  1 process uses all CPU threads; N processes (torchrun, FSDP2 dp_shard=N) split them.
SmolLM2-135M has 9 heads / 3 kv heads, so tp=2 cannot apply to it (tp must divide 3).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_md import write_section

REPO = Path(__file__).resolve().parent.parent
SECTION = "## TorchTitan trainer"


def _model_dir() -> tuple[str, str]:
    try:
        from rollpacker.backends.models import default_model_dir

        return str(default_model_dir()), "SmolLM2-135M-Instruct"
    except Exception as exc:  # models.py missing or the GGUF package absent: same shape, random
        print(f"default model unavailable ({exc}); using a random model of its shape", file=sys.stderr)
        return _random_smollm2_shape(), "random Llama with SmolLM2-135M's shape"


def _random_smollm2_shape() -> str:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(tempfile.gettempdir()) / "rollpacker-bench-smollm2-shape"
    if not (path / "config.json").is_file():
        torch.manual_seed(0)
        cfg = LlamaConfig(
            vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
            num_attention_heads=9, num_key_value_heads=3, head_dim=64, rope_theta=100000.0,
            rms_norm_eps=1e-5, max_position_embeddings=8192, tie_word_embeddings=True,
        )
        LlamaForCausalLM(cfg).save_pretrained(path)
    return str(path)


def _throughput(args: argparse.Namespace, times: list[float]) -> dict:
    """Median and best micro-batch: the machine is shared, and the best is the least disturbed."""
    tokens = args.batch * (args.prompt + args.response)
    ordered = sorted(times)
    median = ordered[len(ordered) // 2]
    return {
        "dtype": args.dtype, "batch": args.batch, "prompt": args.prompt, "response": args.response,
        "iters": args.iters, "fwd_bwd_s": [round(t, 2) for t in times],
        "tokens_per_s": round(tokens / median, 1), "best_tokens_per_s": round(tokens / ordered[0], 1),
        "response_tokens_per_s": round(args.batch * args.response / median, 1),
    }


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from rollpacker.backends.titan.trainer import TitanTrainer
    from rollpacker.backends.titan.config import TitanConfig
    from rollpacker.core.protocols import MicroBatch, TrainSample

    nproc = int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(max(1, args.threads // nproc))
    t0 = time.perf_counter()
    trainer = TitanTrainer(TitanConfig(model_dir=args.model_dir, dp_shard=-1, dtype=args.dtype, lr=1e-6, device="cpu"))
    build_s = time.perf_counter() - t0
    rng = random.Random(0)

    def micro_batch() -> MicroBatch:
        return MicroBatch(tuple(
            TrainSample(
                tuple(rng.randrange(trainer.vocab_size) for _ in range(args.prompt)),
                tuple(rng.randrange(trainer.vocab_size) for _ in range(args.response)),
                advantage=rng.uniform(-1, 1), token_weight=1.0,
            )
            for _ in range(args.batch)
        ))

    trainer.forward_backward(micro_batch())  # warm-up
    trainer.discard_gradients()
    times = []
    for _ in range(args.iters):
        batch = micro_batch()
        dist.barrier()
        t0 = time.perf_counter()
        trainer.forward_backward(batch)
        dist.barrier()
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    trainer.optimizer_step(1.0)
    step_s = time.perf_counter() - t0
    if dist.get_rank() == 0:
        out = {"nproc": nproc, "threads_per_proc": torch.get_num_threads(), "build_s": round(build_s, 2),
               "optimizer_step_s": round(step_s, 2), **_throughput(args, times)}
        Path(args.out).write_text(json.dumps(out))
    dist.barrier()
    trainer.close()


def hf_reference(args: argparse.Namespace, model_dir: str) -> dict:
    """The same micro-batches through plain transformers (fwd+bwd of the summed log-likelihood of
    the response) in this process: a yardstick measured under the same machine load."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, args.dtype))
    g = torch.Generator().manual_seed(0)
    seq = args.prompt + args.response

    def run() -> None:
        ids = torch.randint(0, model.config.vocab_size, (args.batch, seq), generator=g)
        logp = torch.log_softmax(model(ids[:, :-1]).logits.float(), -1)
        picked = logp.gather(-1, ids[:, 1:, None])[:, args.prompt - 1:]
        (-picked.sum()).backward()

    run()
    times = []
    for _ in range(args.iters):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return {"nproc": "transformers", "threads_per_proc": args.threads, "build_s": "-", "optimizer_step_s": "-",
            **_throughput(args, times), "load_before": round(load, 1)}


def launch(nproc: int, args: argparse.Namespace, model_dir: str) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    worker_args = [
        str(Path(__file__).resolve()), "--worker", "--model-dir", model_dir, "--out", out,
        "--dtype", args.dtype, "--batch", str(args.batch), "--prompt", str(args.prompt),
        "--response", str(args.response), "--iters", str(args.iters), "--threads", str(args.threads),
    ]
    load = os.getloadavg()[0]
    if nproc == 1:
        cmd = [sys.executable, *worker_args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *worker_args]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS=str(max(1, args.threads // nproc)))
    subprocess.run(cmd, check=True, env=env, cwd=REPO)
    return {**json.loads(Path(out).read_text()), "load_before": round(load, 1)}


def write_results(rows: list[dict], model_name: str, command: str) -> None:
    lines = [
        SECTION,
        "",
        f"Forward+backward throughput of `TitanTrainer` (TorchTitan 0.3.0, FSDP2 over gloo), {model_name}, "
        f"CPU only: {os.cpu_count()} cores ({platform.processor() or platform.machine()}). "
        "No GPU was available in this session, so there are no GPU figures.",
        "",
        f"Command: `{command}`",
        "",
        "| processes | threads/proc | dtype | micro-batch | tokens/s (fwd+bwd, all tokens), median | best | response tokens/s, median | optimizer step s | build s | load avg before |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        who = f"{r['nproc']} (dp_shard={r['nproc']})" if isinstance(r["nproc"], int) else "plain transformers, 1"
        lines.append(
            f"| {who} | {r['threads_per_proc']} | {r['dtype']} | "
            f"{r['batch']} x ({r['prompt']}+{r['response']}) | {r['tokens_per_s']} | {r['best_tokens_per_s']} | {r['response_tokens_per_s']} | "
            f"{r['optimizer_step_s']} | {r['build_s']} | {r['load_before']} |"
        )
    lines += [
        "",
        "tokens/s are summed over ranks; the plain-transformers row runs the same batches without TorchTitan "
        "or the GRPO loss, as a yardstick under the same machine load. Two processes on two cores split the same cores, so FSDP2 adds its "
        "all-gather/reduce-scatter cost without adding compute. The machine is shared with other jobs "
        "(1-minute load average before each run in the last column, on 2 cores): with load above 2, runs with "
        "2 threads per process oversubscribe the cores and slow down several-fold, so compare rows of similar load.",
        "",
    ]
    write_section(SECTION.removeprefix("## "), "\n".join(lines[1:]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir")
    ap.add_argument("--out")
    ap.add_argument("--nproc", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--batch", type=int, default=8, help="samples per micro-batch")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--response", type=int, default=192)
    ap.add_argument("--iters", type=int, default=3, help="timed micro-batches (median and best reported)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--write-results", action="store_true")
    ap.add_argument("--no-reference", action="store_true", help="skip the plain-transformers yardstick row")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    model_dir, model_name = (args.model_dir, args.model_dir) if args.model_dir else _model_dir()
    rows = [launch(n, args, model_dir) for n in args.nproc]
    if not args.no_reference:
        rows.append(hf_reference(args, model_dir))
    for r in rows:
        print(json.dumps(r))
    if args.write_results:
        write_results(rows, model_name, "python " + " ".join(["benchmarks/titan_throughput.py", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
