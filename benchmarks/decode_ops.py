"""Counts the aten ops one decode step of the embedded engine's runner launches (on CPU, float32), in
total, inside one decoder layer, and outside the layers, with the op histogram of each; with
`--hf`, the same step through HF's plain forward over a DynamicCache as a yardstick.  On CUDA the
step replays a graph of the same ops: each op that computes is a kernel launch there (views, slices,
transposes and reshapes launch none; `views` below counts them).

An op is counted when the profiler records an `aten::` event whose parent is not itself an
`aten::` event (nested calls, e.g. aten::empty inside aten::matmul, are part of their parent).
The ops of a layer are those under a `record_function` opened around the forward of layer 0 by
module hooks.

    python benchmarks/decode_ops.py [--rows 16] [--context 128] [--tiny] [--hf] [--write-results]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rollpacker.backends.embedded.runner import Runner  # noqa: E402

LAYER_MARK = "decode_ops.layer0"


def _top_level_ops(prof) -> list[tuple[str, bool]]:
    """(name, inside layer 0) of every top-level aten op the profile recorded."""
    ops = []
    for event in prof.events():
        parent = event.cpu_parent
        if not event.name.startswith("aten::") or (parent is not None and parent.name.startswith("aten::")):
            continue
        inside = False
        while parent is not None:
            inside = inside or parent.name == LAYER_MARK
            parent = parent.cpu_parent
        ops.append((event.name, inside))
    return ops


def count_ops(layer: torch.nn.Module, step) -> dict:
    """Profile one call of `step()` and count its top-level aten ops: total, in `layer`, outside
    the decoder layers (total minus `num_layers` x per layer is left to the caller)."""
    marks = []

    def enter(*_):
        marks.append(torch.profiler.record_function(LAYER_MARK))
        marks[-1].__enter__()

    def leave(*_):
        marks.pop().__exit__(None, None, None)

    pre, post = layer.register_forward_pre_hook(enter), layer.register_forward_hook(leave)
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            step()
    finally:
        pre.remove()
        post.remove()
    ops = _top_level_ops(prof)
    layer_ops = collections.Counter(name for name, inside in ops if inside)
    return {"total": len(ops), "layer": layer_ops, "all": collections.Counter(name for name, _ in ops)}


def build_runner(model, rows: int, context: int, attention: str) -> tuple[Runner, torch.Tensor, list[int]]:
    """A runner as the engine builds it (cache sized up front), with `rows` rows of `context` tokens
    prefilled; returns it with the next tokens and the rows' lengths."""
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    runner = Runner(model, pad_token_id=int(pad), capacity=rows, attention=attention,
                    cols_per_slot=context + 64)
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompts = torch.randint(0, vocab, (rows, context), generator=gen).tolist()
    logits = runner.prefill(0, prompts)
    return runner, logits.argmax(-1).view(rows, 1), [context] * rows


def decode_step(runner: Runner, tokens: torch.Tensor, row_len: list[int]):
    """One decode step with the engine's greedy pick (the logits' argmax) folded in."""
    return lambda: runner.decode(tokens, row_len)[:, -1].argmax(-1)


def runner_counts(model, rows: int, context: int, attention: str, warmup: int = 3) -> dict:
    runner, tokens, row_len = build_runner(model, rows, context, attention)
    step = decode_step(runner, tokens, row_len)
    for _ in range(warmup):
        step()
    return _summary(count_ops(runner.decoder.layers[0], step), runner.num_layers)


def hf_counts(model, rows: int, context: int) -> dict:
    """The same step through HF's own forward over a DynamicCache holding `context` tokens a row."""
    from transformers import DynamicCache
    ids = torch.randint(0, model.config.vocab_size, (rows, context), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        cache = DynamicCache()
        model(input_ids=ids, past_key_values=cache, use_cache=True)
        nxt = ids[:, -1:]
        mask = torch.ones(rows, context + 1, dtype=torch.long)

        def step():
            return model(input_ids=nxt, attention_mask=mask, past_key_values=cache, use_cache=True).logits[:, -1].argmax(-1)
        step()
        return _summary(count_ops(model.get_decoder().layers[0], step), model.config.num_hidden_layers)


def _summary(counts: dict, num_layers: int) -> dict:
    per_layer = sum(counts["layer"].values())
    outside = counts["all"] - collections.Counter({k: v * num_layers for k, v in counts["layer"].items()})
    return {"ops_per_step": counts["total"], "ops_per_layer": per_layer, "num_layers": num_layers,
            "ops_outside_layers": counts["total"] - per_layer * num_layers,
            "layer_histogram": dict(counts["layer"].most_common()),
            "outside_histogram": dict(outside.most_common())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--attention", default="matmul", choices=["matmul", "sdpa"],
                        help="the runner's decode attention (matmul: the engine's choice on CUDA)")
    parser.add_argument("--tiny", action="store_true", help="the tiny random 2-layer Llama, not SmolLM2-135M")
    parser.add_argument("--hf", action="store_true", help="also count HF's plain forward of the same step")
    parser.add_argument("--write-results", action="store_true")
    args = parser.parse_args()
    from rollpacker.backends.models import default_model_dir, load_model, tiny_random_llama
    model, _ = load_model(tiny_random_llama() if args.tiny else default_model_dir(), device="cpu", dtype="float32")
    result = {"rows": args.rows, "context": args.context, "attention": args.attention,
              "runner": runner_counts(model, args.rows, args.context, args.attention)}
    if args.hf:
        result["hf"] = hf_counts(model, args.rows, args.context)
    print(json.dumps(result))
    if args.write_results:
        from results_md import write_section
        write_section("Decode step ops (embedded runner, CPU profile)", _markdown(result))


VIEW_OPS = ("aten::view", "aten::slice", "aten::transpose", "aten::unsqueeze", "aten::reshape", "aten::expand_as",
            "aten::select", "aten::detach_", "aten::lift_fresh")
"""Ops that make a view (or a no-op on an inference tensor): no kernel (a reshape of a contiguous tensor is a view)."""


def views(histogram: dict) -> int:
    return sum(n for op, n in histogram.items() if op in VIEW_OPS)


def _markdown(result: dict) -> str:
    r = result["runner"]
    lines = [f"One decode step at {result['rows']} rows x {result['context']} context, attention "
             f"{result['attention']}, float32 on CPU (`benchmarks/decode_ops.py`): top-level aten ops.", "",
             f"- runner: {r['ops_per_step']} ops per step, {r['ops_per_layer']} per layer x {r['num_layers']} "
             f"layers, {r['ops_outside_layers']} outside the layers; of a layer's ops {views(r['layer_histogram'])} "
             f"are views (no kernel)"]
    if "hf" in result:
        h = result["hf"]
        lines.append(f"- HF forward over a DynamicCache (its default attention, SDPA: fused, not the runner's "
                     f"matmul): {h['ops_per_step']} ops per step, {h['ops_per_layer']} per layer, "
                     f"{views(h['layer_histogram'])} of them views")
    lines += ["", "Per layer: " + ", ".join(f"{k} {v}" for k, v in r["layer_histogram"].items()),
              "", "Outside the layers: " + ", ".join(f"{k} {v}" for k, v in r["outside_histogram"].items())]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
