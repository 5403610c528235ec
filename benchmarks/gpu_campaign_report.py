"""The RESULTS.md text of each part of benchmarks/gpu_campaign.py, from the part's figures: one
function per part, `(figures, header) -> markdown` (its `###` subsection's body)."""

from __future__ import annotations

import json
from pathlib import Path


def env_body(r: dict, header: str) -> str:
    optional = "; ".join(f"`{m}` missing ({why})" for m, why in r["missing_optional"].items()) or "every optional module imports"
    return "\n".join([header, "", f"Python {r['python']}, torch {r['torch']} (CUDA {r['cuda']}), transformers "
                      f"{r['transformers']}, GPU: {r['gpu']}.  Required modules import; {optional}."])


def engine_body(r: dict, header: str) -> str:
    rows = [("rollpacker embedded engine", r["embedded_tok_s"], r["embedded_vs_static"]),
            ("static `generate` (padded batches)", r["static_tok_s"], 1.0)]
    if r.get("hf_cb_tok_s") is not None:
        rows.append(("transformers continuous batching", r["hf_cb_tok_s"], r["hf_cb_vs_static"]))
    lines = [header, "", f"Command: `{r['command']}`", "",
             f"{r['num_requests']} requests, cap {r['cap']} new tokens, capacity {r['batch']}, {r['dtype']}; "
             f"lengths {r['lengths']}.", "", "| engine | tokens/s | vs static |", "|---|---|---|"]
    lines += [f"| {name} | {tok_s} | {ratio}x |" for name, tok_s, ratio in rows]
    if r.get("embedded_vs_hf_cb") is not None:
        lines += ["", f"Embedded engine against transformers' continuous batching: {r['embedded_vs_hf_cb']}x."]
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
    """Each seed's row of every policy, then the median over seeds of the step-time ratio."""
    base = s["policies"][0]
    peak = "" if s["cuda_peak_gib"] is None else f" Measured peak CUDA memory allocated: {s['cuda_peak_gib']} GiB."
    seeds = ", ".join(str(seed) for seed in s["seeds"])
    lines = [header, "", f"Command (seed {s['seeds'][0]}; each seed with its own `--seed`): `{s['command']}`", "",
             f"`{s['memory_plan']}`{peak}", "",
             f"| seed | policy | mean step s | {base}/policy step time | bubble ratio | mean reward | on-policy token fraction |",
             "|---|---|---|---|---|---|---|"]
    for seed, r in s["runs"].items():
        for p in s["policies"]:
            ratio = 1.0 if p == base else r["step_time_ratio"][p]
            lines.append(f"| {seed} | {p} | {r['mean_step_s'][p]:.2f} | {ratio:.2f}x | {r['bubble_ratio'][p]:.2f} | "
                         f"{r['mean_reward'][p]:.3f} | {r['on_policy_token_fraction'][p]:.3f} |")
    medians = ", ".join(f"{p} {ratio:.2f}x" for p, ratio in s["median_step_time_ratio"].items())
    lines += ["", f"{base}/policy step time, the median over seeds {seeds}: {medians}."]
    return "\n".join(lines)


def spec_body(r: dict, header: str) -> str:
    lines = [header, "", f"Command: `{r['command']}`", "", "```", *(json.dumps(x) for x in r["rows"]), "```"]
    return "\n".join(lines)


def tests_body(r: dict, header: str) -> str:
    return "\n".join([header, "", f"Command: `{r['command']}`", "", f"Result: {r['summary']}"])


def fidelity_body(r: dict, header: str) -> str:
    state = "complete" if r["complete"] else "incomplete (cut at --budget-s: call the part again)"
    return "\n".join([header, "", f"What: {r['what']}; {state}.", "", f"Command: `{r['command']}`", "",
                      f"Plot: `{Path(r['plot']).name}`.", "", r["text"]])
