"""TRL's GRPOTrainer with its own generation against TRL + rollpacker, side by side, in one run.

The same trl GRPOConfig (seed, batch, num_generations, max_completion_length, float32 on CPU), the
same dataset (rollpacker's reasoning-gym default mix: short, medium and long answers) and the same
reward on the default model (SmolLM2-135M-Instruct); the dataset is one epoch of `--steps` steps, so
the accounting covers a whole epoch.  Per path: TRL's own step times (`step_time`), every prompt of
TRL's epoch trained exactly once (rollpacker's paths: their trained keys against the order TRL's
sampler drew), and the mean length of the completions TRL trained (kept-length bias: over-sampled
responses keep the first R of ceil(eta x R)).  `sync` is rollpacker's engine with TRL's own policy:
against `builtin` it is the engine, against `tail` the scheduling.

    .venv/bin/python benchmarks/trl_tail.py --steps 6 --seeds 0        # writes benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results_md import write_section  # noqa: E402

TITLE = "TRL GRPOTrainer: its own generation vs rollpacker tail batching"


def run(path: str, seed: int, opts) -> dict:
    from trl import GRPOConfig, GRPOTrainer

    from rollpacker.backends.models import default_model_dir
    from rollpacker.integrations.trl import RollpackerGRPOTrainer, RolloutSettings
    from rollpacker.integrations.trl.tasks import reasoning_dataset, task_reward

    dataset = reasoning_dataset(size=opts.prompts * opts.steps, seed=0)
    config = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="trl-tail-"), per_device_train_batch_size=opts.prompts * opts.g,
                        num_generations=opts.g, max_completion_length=opts.max_tokens, max_steps=opts.steps, seed=seed,
                        bf16=False, use_cpu=True, report_to=[], logging_steps=1, save_strategy="no", disable_tqdm=True,
                        learning_rate=1e-6)
    model = str(default_model_dir())
    if path == "builtin":
        trainer = GRPOTrainer(model, task_reward, config, dataset)
    else:
        knobs = {"eta_prompts": opts.eta_prompts, "eta_responses": opts.eta_responses} if path == "tail" else {}
        trainer = RollpackerGRPOTrainer(model, task_reward, config, dataset, rollout=RolloutSettings(policy=path, knobs=knobs))
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    logs = [h for h in trainer.state.log_history if "step_time" in h]
    out = {"path": path, "seed": seed, "wall_s": wall, "step_s": [h["step_time"] for h in logs],
           "mean_length": statistics.fmean(h["completions/mean_length"] for h in logs),
           "reward": statistics.fmean(h["reward"] for h in logs), "steps": len(logs)}
    if path != "builtin":
        rollout = trainer.rollpacker
        trained, order = rollout.trained, trainer._feed.orders[0]
        out.update(once=Counter(k.index for k in trained) == Counter(order), trained=len(trained), drawn=len(order),
                   duplicates=len(trained) - len(set(trained)), long_rounds=sum(r.kind == "long" for r in rollout.rounds),
                   deferred=sum(r.report.deferred_prompts for r in rollout.rounds),
                   generated_length=statistics.fmean(r.report.mean_generated_length for r in rollout.rounds))
        trainer.close_rollout()
    print(f"{path} seed {seed}: {out['steps']} steps in {sum(out['step_s']):.1f} s, mean length {out['mean_length']:.1f}",
          flush=True)
    return out


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor() or "unknown CPU")
    return f"{os.cpu_count()}-core CPU ({model}), no GPU"


def report(results: list[dict], opts) -> str:
    by_path = {p: [r for r in results if r["path"] == p] for p in opts.paths}
    total = {p: statistics.median(sum(r["step_s"]) for r in rs) for p, rs in by_path.items()}
    lines = [f"Machine: {machine()}; trl 1.16.0, torch CPU, float32.  Default model (SmolLM2-135M-Instruct), "
             f"reasoning-gym default mix, {opts.steps} steps = one epoch of {opts.prompts * opts.steps} prompts, "
             f"P={opts.prompts} prompts x G={opts.g} per step, max_completion_length={opts.max_tokens}; tail: "
             f"eta_prompts={opts.eta_prompts}, eta_responses={opts.eta_responses}; seeds {opts.seeds} "
             f"(median over seeds).  Command: `.venv/bin/python benchmarks/trl_tail.py --steps {opts.steps} "
             f"--prompts {opts.prompts} --g {opts.g} --max-tokens {opts.max_tokens} --paths {' '.join(opts.paths)} "
             f"--seeds {' '.join(map(str, opts.seeds))}`.", "",
             "| path | step time, s (sum over the epoch) | vs builtin | vs sync | mean trained length | reward | exactly once |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for p, rs in by_path.items():
        once = "n/a (TRL's batches)" if p == "builtin" else (
            f"{all(r['once'] for r in rs)}: {rs[0]['trained']}/{rs[0]['drawn']} trained, "
            f"{sum(r['duplicates'] for r in rs)} twice, {rs[0]['deferred']} deferrals, {rs[0]['long_rounds']} long rounds")
        ratio = f"{total['builtin'] / total[p]:.2f}x" if "builtin" in total else "n/a"
        to_sync = f"{total['sync'] / total[p]:.2f}x" if "sync" in total else "n/a"
        lines.append(f"| {p} | {total[p]:.1f} | {ratio} | {to_sync} | "
                     f"{statistics.median(r['mean_length'] for r in rs):.1f} | "
                     f"{statistics.median(r['reward'] for r in rs):.3f} | {once} |")
    if "tail" in by_path:
        tail = by_path["tail"]
        lines += ["", f"Kept-length bias of tail: trained completions average "
                  f"{statistics.median(r['mean_length'] for r in tail):.1f} tokens against "
                  f"{statistics.median(r['generated_length'] for r in tail):.1f} for every response its rounds ended "
                  f"(aborted ones at their cut)"
                  + (f", and {statistics.median(r['mean_length'] for r in by_path['builtin']):.1f} with TRL's own "
                     "generation" if "builtin" in by_path else "") + "."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--g", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--eta-prompts", type=float, default=1.5)
    parser.add_argument("--eta-responses", type=float, default=1.25)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--paths", nargs="+", default=["builtin", "sync", "tail"])
    parser.add_argument("--no-write", action="store_true")
    opts = parser.parse_args()
    results = [run(p, s, opts) for s in opts.seeds for p in opts.paths]
    body = report(results, opts)
    print(body)
    if not opts.no_write:
        write_section(TITLE if "builtin" in opts.paths else TITLE + ": tail against sync", body)


if __name__ == "__main__":
    main()
