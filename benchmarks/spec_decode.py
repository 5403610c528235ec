"""Speculative decoding in the tail of the embedded engine, on real rollouts of the default tasks.

    .venv/bin/python benchmarks/spec_decode.py                    # CPU, SmolLM2-135M-Instruct
    .venv/bin/python benchmarks/spec_decode.py --device cuda      # on a GPU
    .venv/bin/python benchmarks/spec_decode.py --write-results    # also update RESULTS.md

Workload: reasoning-gym problems of the default mix rendered with the chat template, GRPO groups of
`--group` samples per prompt (siblings: the engine may draft from each other's text), temperature
1, EOS honoured, `--max-tokens` cap.  For each number of running rows (the engine's capacity, so
the batch stays at that size while work remains), the same requests with the same seeds run with
speculation off and on, alternately, best of `--repeats`.  A seeded request's tokens do not
depend on speculation (the verify step samples with the same counter-based uniforms), so both runs
generate the same tokens up to floating-point rounding: a forward of 5 tokens per row rounds its
matmuls differently from a forward of 1, and a sampled token whose uniform falls within that
rounding of a CDF boundary flips (speculation off at 4 and at 16 rows differs the same way).  The
table counts the requests whose tokens are identical; tokens/s is each run's own tokens over its
own time.

Prints one JSON line per row count: tokens/s off and on, their ratio, accepted draft tokens per
verify step and the acceptance rate.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cpu_flags import add_cpu_flags, apply_threads  # noqa: E402
from results_md import write_section  # noqa: E402
from rollpacker.backends.embedded.engine import EmbeddedEngine  # noqa: E402
from rollpacker.backends.models import load_model  # noqa: E402
from rollpacker.backends.data.tasks import make_problems, render_prompt  # noqa: E402
from rollpacker.core.protocols import GenerationRequest, GenerationResult  # noqa: E402


def make_requests(tokenizer, num_prompts: int, group: int, max_tokens: int, seed: int) -> list[GenerationRequest]:
    problems = make_problems(None, size=num_prompts, seed=seed)
    return [
        GenerationRequest(f"r{i:03d}s{k}", tuple(render_prompt(tokenizer, p)), max_tokens,
                          temperature=1.0, seed=seed * 7919 + i * 97 + k, group=f"p{i}")
        for i, p in enumerate(problems) for k in range(group)
    ]


def run(model, requests, rows: int, spec_max_rows: int, spec_tokens: int) -> tuple[float, int, dict, dict]:
    """(seconds, generated tokens, speculation stats, tokens by request).  The KV cache is sized up
    front, so on CUDA every graph (verify widths included) is captured in the constructor, before
    the clock starts; its time is the stats' `graph_capture_s`."""
    longest = max(len(r.prompt_ids) + r.max_new_tokens for r in requests) + spec_tokens
    with EmbeddedEngine(model, capacity=rows, progress_every=1 << 30, spec_max_rows=spec_max_rows,
                        spec_tokens=spec_tokens, kv_tokens_per_row=longest) as engine:
        start = time.perf_counter()
        engine.submit(requests)
        outputs = {}
        while len(outputs) < len(requests):
            for e in engine.poll(1.0):
                if isinstance(e, GenerationResult):
                    outputs[e.request_id] = e.token_ids
        seconds = time.perf_counter() - start
        stats = engine.speculation_stats.as_dict() | {"graph_capture_s": round(engine.capture_s, 3)}
    return seconds, sum(len(t) for t in outputs.values()), stats, outputs


def measure(model, requests, rows: int, spec_tokens: int, repeats: int) -> dict:
    best = {"off": 0.0, "on": 0.0}  # tokens/s, best of the repeats
    for _ in range(repeats):
        t_off, n_off, _, out_off = run(model, requests, rows, 0, spec_tokens)
        t_on, n_on, stats, out_on = run(model, requests, rows, rows, spec_tokens)
        best["off"], best["on"] = max(best["off"], n_off / t_off), max(best["on"], n_on / t_on)
    identical = sum(out_on[r] == out_off[r] for r in out_off)
    return {
        "rows": rows, "requests": len(requests), "tokens": n_off,
        "tok_s_off": round(best["off"], 1), "tok_s_on": round(best["on"], 1),
        "speedup": round(best["on"] / best["off"], 2),
        "accepted_per_verify": stats["accepted_per_verify"], "acceptance_rate": stats["acceptance_rate"],
        "graph_capture_s_on": stats["graph_capture_s"],  # untimed: before each run's clock starts
        "identical": f"{identical}/{len(out_off)}",
    }


def results_body(lines: list[dict], meta: dict) -> str:
    rows = "\n".join(
        f"| {r['rows']} | {r['requests']} | {r['tokens']} | {r['tok_s_off']} | {r['tok_s_on']} | "
        f"**{r['speedup']}x** | {r['accepted_per_verify']} | {r['acceptance_rate']} | {r['identical']} |"
        for r in lines)
    return (
        f"`{meta['command']}` on {meta['machine']}, torch {meta['torch']}, SmolLM2-135M-Instruct "
        f"{meta['dtype']}, default task mix, groups of {meta['group']}, temperature 1, cap {meta['max_tokens']} "
        f"tokens, {meta['spec_tokens']} draft tokens per verify, best of {meta['repeats']} alternating runs.\n\n"
        "| running rows | requests | tokens | tok/s off | tok/s on | speed-up | accepted per verify | "
        "acceptance | identical requests |\n|---|---|---|---|---|---|---|---|---|\n" + rows + "\n\n"
        "Accepted per verify: draft tokens accepted per row and verify forward (each verify also emits "
        "one token of its own).  Identical requests: requests whose tokens are the same with speculation "
        "on and off (seeded sampling does not depend on drafts; the rest differ by floating-point rounding "
        "between a 1-token and a k+1-token forward, see the benchmark's docstring)."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--model", default=None, help="HF model directory (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--rows", default="1,4,16", help="running rows to measure, comma-separated")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per measurement (default: rows, min 2)")
    parser.add_argument("--group", type=int, default=4, help="samples per prompt (siblings)")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--spec-tokens", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    add_cpu_flags(parser)
    args = parser.parse_args()
    apply_threads(args)
    dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    model, tokenizer = load_model(args.model, dtype=dtype, device=args.device)
    meta = {"command": "python benchmarks/spec_decode.py " + " ".join(sys.argv[1:]),
            "machine": (torch.cuda.get_device_name() if args.device == "cuda"
                        else f"{platform.machine()} {os.cpu_count()} CPU cores, {torch.get_num_threads()} torch threads"),
            "torch": torch.__version__, "dtype": dtype, "group": args.group, "max_tokens": args.max_tokens,
            "spec_tokens": args.spec_tokens, "repeats": args.repeats}
    lines = []
    for rows in [int(r) for r in args.rows.split(",")]:
        num_prompts = args.prompts or max(2, rows)
        requests = make_requests(tokenizer, num_prompts, args.group, args.max_tokens, args.seed)
        line = {"bench": "spec_decode", **measure(model, requests, rows, args.spec_tokens, args.repeats)}
        print(json.dumps(line), flush=True)
        lines.append(line)
    if args.write_results:
        write_section("Embedded engine", results_body(lines, meta),
                      subsection=f"Speculative decoding in the tail ({meta['machine']})")


if __name__ == "__main__":
    main()
