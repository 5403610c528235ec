"""`rollpacker advise LOG`: what tail batching (and the field's other policies) would save on a user's own
run, predicted by the simulator on the run's own lengths, at the run's own scale.

    rollpacker advise runs/rollout_dumps --gpus 16 --model 7b --max-tokens 8192
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import attrs

from rollpacker.sim import MODELS, SimConfig, SimConstants
from rollpacker.sim.compare import ROLLOUT

from .calibrate import TimedSimulation, agent_ratio, calibrated, mean_of, simulated_agent_ratio
from .fit import BETWEEN, synthetic_groups
from .formats import FORMATS, read_log
from .records import AdviseError, ImportedLog
from .report import plot, recommendation, table
from .search import candidates, outcomes, run_search, search_configs
from .workload import Batch, choose_steps, tier1_batch

SIZES = {"7b": "qwen2.5-7b", "8b": "llama3.1-8b", "14b": "qwen2.5-14b", "32b": "qwen2.5-32b"}


def add_parser(sub, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="predict what tail batching would save on your run, from its logs",
                       description="What tail batching (and the field's other policies) would save on your run: "
                                   "the simulator on the run's own lengths, at its own scale (see docs/advise.md).")
    p.add_argument("log", type=Path, help="a veRL rollout_data_dir or file-logger JSONL, a TRL output dir, completions "
                   "parquet or trainer_state.json, a W&B history export (CSV, parquet), or a rollpacker metrics.jsonl")
    p.add_argument("--format", default="auto", choices=FORMATS,
                   help="verl: rollout dumps (per sample); verl-metrics: the file logger (step scalars); trl: "
                        "completions parquet (per sample); trl-state: trainer_state.json (step scalars); wandb: a "
                        "history export; rollpacker: metrics.jsonl or a workload file (default: told from the path)")
    p.add_argument("--gpus", type=int, required=True, help="rollout GPUs of the run")
    p.add_argument("--model", required=True, help=f"model size: {', '.join(SIZES)} or one of {', '.join(MODELS)}")
    p.add_argument("--tp", type=int, default=1, help="tensor parallel size of a rollout engine")
    p.add_argument("--max-tokens", type=int, default=None, help="the run's response cap (required where the log "
                   "does not state it: veRL data.max_response_length, TRL max_completion_length)")
    p.add_argument("--tokenizer", default=None, help="a local tokenizer directory to count a dump's text with "
                   "(default: SmolLM2-135M-Instruct's; nothing is downloaded)")
    p.add_argument("--prompts", type=int, default=None, help="P, prompts a step (step scalars only: the log has no batch size)")
    p.add_argument("--samples", type=int, default=None, help="R, responses a prompt (step scalars only)")
    p.add_argument("--times", type=Path, default=None, metavar="LOG2", help="a second log of the same run whose step "
                   "times calibrate the engine (a rollout dump has none: give veRL's file-logger JSONL, TRL's "
                   "trainer_state.json or a W&B export here)")
    p.add_argument("--window", type=int, default=4, help="steps of the log simulated, spread over the run (default 4)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="simulator seeds (default 0 1)")
    p.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1), help="simulations run at once")
    p.add_argument("--out", type=Path, default=Path("advise"), help="folder for advice.json, advice.png and the "
                   "workload file(s) (default ./advise)")
    p.add_argument("--no-plot", action="store_true", help="no advice.png")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def check_args(args: argparse.Namespace) -> str:
    """The model's name; a bad flag is an AdviseError before any work."""
    model = SIZES.get(args.model.lower(), args.model.lower())
    if model not in MODELS:
        raise AdviseError(f"--model {args.model!r}: not one of {', '.join(SIZES)} or {', '.join(MODELS)}")
    for flag, value in (("--gpus", args.gpus), ("--tp", args.tp), ("--jobs", args.jobs), ("--max-tokens", args.max_tokens),
                        ("--prompts", args.prompts), ("--samples", args.samples)):
        if value is not None and value < 1:
            raise AdviseError(f"{flag} {value}: must be >= 1")
    if args.gpus % args.tp:
        raise AdviseError(f"--gpus {args.gpus} is not a multiple of --tp {args.tp}")
    if args.window < 2:
        raise AdviseError(f"--window {args.window}: must be >= 2 (tail batching shows over several steps)")
    if not args.out.parent.exists():
        raise AdviseError(f"--out {str(args.out)!r}: directory {str(args.out.parent)!r} does not exist")
    return model


def response_cap(args: argparse.Namespace, log: ImportedLog) -> int:
    if args.max_tokens is None and log.max_tokens is None:
        raise AdviseError("the log does not state the response cap: pass --max-tokens L (veRL "
                          "data.max_response_length, TRL max_completion_length)")
    cap = args.max_tokens or log.max_tokens
    longest = max((s.max for s in log.scalars if s.max), default=0)
    if longest > cap:
        raise AdviseError(f"--max-tokens {cap} is lower than the log's longest response ({longest:.0f} tokens): "
                          f"pass the run's response cap")
    return cap


def batches(args, log: ImportedLog, steps: list[int], cap: int) -> tuple[list[Batch], list[str]]:
    """Tier 1: the log's own groups; tier 2: one synthetic batch per assumed prompt structure."""
    if log.tier == 1:
        tokenizer, name = None, None
        if any(s.tokens is None for s in log.samples if s.step in steps):
            from .tokens import load_tokenizer

            tokenizer, name = load_tokenizer(args.tokenizer)
        texts = sum(s.tokens is None for s in log.samples if s.step in steps)
        bar = _bar(args, texts, "tokenize", "response") if texts else None
        try:
            batch = tier1_batch(log, steps, cap, tokenizer, bar)
        finally:
            if bar is not None:
                bar.close()
        told = [f"lengths re-tokenized with {name} (+1 for the stripped EOS below the cap)"] if name else []
        for flag, value, got in (("--prompts", args.prompts, batch.prompts), ("--samples", args.samples, batch.samples)):
            if value is not None and value != got:
                told.append(f"{flag} {value} ignored: the dump's groups give {got}")
        return [batch], told
    if args.prompts is None or args.samples is None:
        raise AdviseError("step scalars give no batch size: pass --prompts P --samples R (veRL: data.train_batch_size "
                          "and actor_rollout_ref.rollout.n; TRL: prompts a step and num_generations)")
    chosen = [s for s in log.scalars if s.step in steps]
    out = [Batch(tuple(synthetic_groups(chosen, cap, args.prompts, args.samples, b)), args.prompts, args.samples)
           for b in BETWEEN]
    return out, [f"lengths: a log-normal per step fitted to its mean and clip ratio (or longest); the prompt structure "
                 f"is unknown: the advice is a range over {', '.join(map(str, BETWEEN))} of log-length variance between "
                 f"prompts"]


def run(args: argparse.Namespace) -> int:
    model = check_args(args)
    log = read_log(args.log, args.format)
    if args.times is not None:
        timed = read_log(args.times)
        log = attrs.evolve(log, times=timed.times, max_tokens=log.max_tokens or timed.max_tokens,
                           notes=log.notes + (f"step times from {args.times} ({timed.source})",))
    cap = response_cap(args, log)
    steps = choose_steps(log.steps, args.window)
    found, told = batches(args, log, steps, cap)
    args.out.mkdir(exist_ok=True)
    suffixes = [""] if len(found) == 1 else [f"-between-{b}" for b in BETWEEN]
    paths = [str(b.write(args.out / f"workload{s}.jsonl")) for b, s in zip(found, suffixes)]
    first = found[0]
    base = SimConfig(workload=paths[len(paths) // 2], policy="sync", prompts=first.prompts, samples=first.samples,
                     max_tokens=cap, epochs=1, instances=args.gpus // args.tp, tp=args.tp, model=model,
                     dataset_prompts=len(first.groups))
    constants, lines = calibrate(base, log, steps)
    results = run_search(search_configs(base, paths, args.seeds), constants, args.jobs,
                         _bar(args, len(candidates()) * len(paths) * len(args.seeds), "simulate", "run"))
    found_outcomes = outcomes(results, paths, args.seeds)
    lines += check_calibration(results, paths, args.seeds, mean_of(list(log.times), "gen_s", steps))
    point = log.tier == 1
    header = describe(args, log, steps, first, cap, model) + [f"note: {n}" for n in (*log.notes, *first.notes, *told)]
    text = header + lines + [""] + table(found_outcomes, point) + [""] + recommendation(found_outcomes, point)
    print("\n".join(text))
    report = {"log": str(args.log), "source": log.source, "tier": log.tier, "steps": steps, "prompts": first.prompts,
              "samples": first.samples, "max_tokens": cap, "gpus": args.gpus, "tp": args.tp, "model": model,
              "seeds": args.seeds, "workloads": paths, "text": text, "outcomes": [o.to_dict() for o in found_outcomes]}
    (args.out / "advice.json").write_text(json.dumps(report, indent=1) + "\n")
    written = [args.out / "advice.json", *map(Path, paths)]
    if not args.no_plot:
        written.append(plot(found_outcomes, f"{log.source}: P={first.prompts} R={first.samples} L={cap}, "
                            f"{args.gpus} GPUs {model} TP{args.tp}", args.out / "advice.png", point))
    print("wrote " + ", ".join(map(str, written)))
    return 0


def describe(args, log: ImportedLog, steps: list[int], batch: Batch, cap: int, model: str) -> list[str]:
    return [f"{args.log}: {log.source}, {len(log.steps)} steps; simulated steps {', '.join(map(str, steps))} "
            f"({len(batch.groups)} prompts, an epoch each run)",
            f"setting: P={batch.prompts} R={batch.samples} max tokens {cap}, {args.gpus} GPU{'s' * (args.gpus > 1)} of {model} at TP{args.tp}; "
            f"seeds {' '.join(map(str, args.seeds))}; gains are sync's time over the policy's, per P trained prompts"]


def calibrate(base: SimConfig, log: ImportedLog, steps: list[int]) -> tuple[SimConstants, list[str]]:
    """The constants (the engine scaled to the log's generation time, where it has one) and what was found."""
    sim = TimedSimulation(base, SimConstants())  # checks the setting (the model fits at this TP) before the search
    simulated = sim.run()["total"][ROLLOUT]
    gen = mean_of(list(log.times), "gen_s", steps)
    lines = []
    if gen:
        k = simulated / gen
        lines.append(f"calibrated: the log's generation takes {gen:.1f} s a step, the simulated H100 engine "
                     f"{simulated:.1f} s: engine speed x{k:.2f}")
        constants = calibrated(SimConstants(), k)
    else:
        lines.append("not calibrated: the log has no generation time (veRL timing_s/gen, TRL's generate profiling "
                     "time); simulated H100 engine speed (rollpacker/sim/constants.py)")
        constants = SimConstants()
    real, simulated_ratio = agent_ratio(list(log.times)), simulated_agent_ratio(sim)
    if real and simulated_ratio:
        lines.append(f"agent loop: slowest over mean sample generation time, log {real:.2f}, simulated sync "
                     f"{simulated_ratio:.2f}")
    return constants, lines


def check_calibration(results: dict, paths: list[str], seeds: list[int], gen: float | None) -> list[str]:
    if not gen:
        return []
    errors = [results[("sync", w, s)][ROLLOUT] / gen - 1 for w in paths for s in seeds]
    return [f"calibration check: simulated sync generation per step {min(errors):+.1%} to {max(errors):+.1%} "
            f"of the log's over the search's sync runs"]


def _bar(args, total: int, desc: str, unit: str):
    if args.no_progress:
        return None
    try:
        from tqdm import tqdm
    except ModuleNotFoundError:
        return None
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False)
