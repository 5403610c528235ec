"""The simulator against real engines: a length trace replayed through a real engine under each policy,
beside the simulator's prediction of the same workload with the engine's fitted profile.

    .venv/bin/python benchmarks/sim_vs_real.py --quick             # <= 4 min: tiny model, embedded, sync and tail
    .venv/bin/python benchmarks/sim_vs_real.py --model tiny --policies sync,tail,sorted --seeds 0,1,2
    .venv/bin/python benchmarks/sim_vs_real.py --model default --max-tokens 64 --capacity 32
    .venv/bin/python benchmarks/sim_vs_real.py --engine sglang --model tiny       # two real SGLang servers
    ... --write-results        # also the RESULTS.md section "Simulator against real engines"

Four parts, all on this machine, one after another (nothing else should run beside them):

1. **Calibrate** (`rollpacker.backends.calibration`): time the engine on a grid of (rows, prompt tokens,
   new tokens) and abort a few running requests; fit the simulator's instance latency model to it
   (`rollpacker.sim.engine_profile`): the engine profile, written to `--out`/profile.json.
2. **Fit the rest**: the trainer (`time_trainer`: forward and backward of micro-batches on a grid of
   rows, prompt and response tokens, and an optimizer step; `rollpacker.sim.stages.fit_train`); then a
   short run of the reference trainer replaying the fit workload (`--fit-workload`, default azure-conv;
   `--fit-policy`, default sync; several, comma-separated: a run each, their rounds fitted together, so that
   launches, finishes and decode steps vary apart), whose rounds, beside their prediction, give the live path's time a
   launch (`EngineProfile.launch_s`, SGLang only), a decode step (`step_s`: the driver's thread shares the
   engine's interpreter and cores here) and, from tail rounds, which differ in their finished requests, a
   finished request (`event_s`; alone where the trainer trains beside the rollout), and whose step records
   give the scorer's latency and the weight sync.
3. **Measure**: for each policy and seed, the reference trainer's real path (`Session`: the core, the
   live driver, the real engine decoding real tokens, real reward workers, the real trainer, weights
   synced each step) with `--replay-lengths` on the check workload (`--workload`, default servegen-r1):
   each response stops at the length the trace gives its (prompt, sample).  Training runs after the round
   (`--colocate` on the embedded engine, `--train-after-round` on SGLang, whose memory release needs a GPU
   package), so it does not take the engine's cores mid-round, as on a GPU node whose trainer has devices
   of its own (`--train-beside`: beside the rollout instead).
4. **Predict**: `rollpacker simulate`'s Simulation of the same workload (the same lengths per (prompt,
   sample), the dataset's own prompt lengths), seed, policy, sizes and micro-batches, on instances of
   the fitted profile, the stages from part 2.

Step 0 is a warm-up on both sides (the reward pool's first answers, first allocations) and is left out
of every figure.  Per round: rollout seconds, the round's longest request, bubble, wasted tokens,
measured beside predicted; per policy: mean step and rollout seconds; per seed: the sync/policy
ratio.  The last line reads `sim vs real: sync/tail measured X predicted Y (error Z%)`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from results_md import write_section  # noqa: E402
from sim_vs_real_calibrate import GRIDS, calibrate, calibrate_trainer, machine, model_dir  # noqa: E402
from sim_vs_real_fit import (after_warmup, finished, fit_policy, fit_round, fit_runs, predict_fit_runs, refit,  # noqa: E402, F401
                             with_live_term)
from sim_vs_real_predict import Workload, dataset_size, predict, repredict  # noqa: E402
from sim_vs_real_report import headline, profile_line, report, round_rows, streams_training  # noqa: E402

from rollpacker.sim.engine_profile import EngineProfile  # noqa: E402, F401 - for the tests

SECTION = "Simulator against real engines"
QUICK = dict(model="tiny", engine="embedded", policies="sync,tail", seeds="0", steps=6, prompts=8, samples=8,
             max_tokens=128, capacity=64, fit_steps=3, grid="quick")
# -- real runs --------------------------------------------------------------------------------------

def run_flags(args, policy: str, seed: int, workload: Workload, steps: int, out: Path, urls) -> list[str]:
    flags = ["--model", model_dir(args.model), "--trainer", "torch", "--policy", policy, "--seed", str(seed),
             "--steps", str(steps), "--prompts", str(args.prompts), "--samples", str(args.samples),
             "--max-tokens", str(args.max_tokens), "--dataset-size", str(dataset_size(args)),
             "--engine-capacity", str(args.capacity), "--reward-workers", "1",
             "--device", args.device, "--dtype", args.dtype,
             "--replay-lengths", workload.name, "--replay-scale-from", str(workload.scale_from), "--out", str(out)]
    if urls:
        flags += ["--rollout", "sglang", "--sglang-urls", *urls]
    if not streams_training(args):  # (SGLang's memory release needs a GPU package: on a CPU it stopped the
        flags += ["--train-after-round" if urls else "--colocate"]  # server, so its engine keeps its memory)
    return flags


def real_run(args, policy: str, seed: int, workload: Workload, steps: int, out: Path, urls) -> tuple[list[dict], int]:
    """`steps` steps of the reference trainer's real path replaying `workload`; (step records, micro-batch tokens)."""
    from rollpacker.train.config import parse
    from rollpacker.train.outputs import RunDir
    from rollpacker.train.session import Session

    config = parse(run_flags(args, policy, seed, workload, steps, out, urls))
    config.validate()
    session = Session(config, RunDir(config.out))
    records = []
    try:
        session.begin()
        for _ in range(steps):
            record = session.run_step()
            session.run_dir.log_step(record)
            records.append(record)
            print(f"  real {policy} seed {seed} step {record['step']} {record['round']}: rollout "
                  f"{record['rollout_s']:.2f} s, step {record['step_s']:.2f} s", flush=True)
    finally:
        session.close()
    return records, config.micro_batch_tokens


# -- main -------------------------------------------------------------------------------------------------

def run(args) -> dict:
    out = Path(args.out or tempfile.mkdtemp(prefix="rollpacker-sim-vs-real-"))
    out.mkdir(parents=True, exist_ok=True)
    urls, servers = start_servers(args, out)
    try:
        profile = calibrate(args, out, urls)
        fit, policies, fit_records = Workload(args.fit_workload, args.fit_scale_from), fit_policy(args).split(","), []
        for policy in policies:
            records, tokens = real_run(args, policy, 0, fit, args.fit_steps,
                                       out / ("fit" if len(policies) == 1 else f"fit-{policy}"), urls)
            fit_records += [{**r, "policy": policy} for r in records]
        stages = calibrate_trainer(args, tokens)
        later = after_warmup(fit_runs(args, fit_records))
        stages |= {"reward_median_s": max(statistics.median(r["reward_latency_s_mean"] for r in later), 1e-4),
                   "optimizer_s": stages["optimizer_s"] + statistics.median(r["sync_s"] for r in later)}
        profile = with_live_term(args, profile, out, fit_records, stages, tokens)
        profile_path = out / "profile.json"
        print(f"stages: {stages}\nprofile: {profile_line(profile)}", flush=True)
        check = Workload(args.workload, args.scale_from)
        runs = []
        for seed in [int(s) for s in args.seeds.split(",")]:
            for policy in args.policies.split(","):
                records, tokens = real_run(args, policy, seed, check, args.steps, out / f"{policy}-{seed}", urls)
                sim = predict(args, profile_path, policy, seed, check, args.steps, stages, tokens, len(urls or [1]))
                runs.append((policy, seed, round_rows(records, sim)))
    finally:
        if servers is not None:
            servers.__exit__(None, None, None)
    result = {"args": vars(args), "command": " ".join(sys.argv[1:]), "machine": machine(),
              "date": time.strftime("%Y-%m-%d"), "profile": profile.to_dict(), "stages": stages,
              "micro_batch_tokens": tokens, "fit_rounds": [fit_round(r) for r in fit_records], "runs": runs}
    (out / "result.json").write_text(json.dumps(result, indent=1))
    return result


def start_servers(args, out: Path):
    """(their URLs, the server group) for --engine sglang: two real SGLang servers; (None, None) otherwise."""
    if args.engine != "sglang":
        return None, None
    sys.path.insert(0, str(ROOT / "tests"))
    from sglang_helpers import SGLANG_HINT, sglang_python

    from rollpacker.backends.sglang.launch import launch_servers

    python = sglang_python()
    if python is None:
        raise SystemExit(SGLANG_HINT)
    extra = ("--max-total-tokens", str(16384), "--max-running-requests", str(args.capacity // 2),
             "--enable-metrics")  # (the answers' ways back: `ways_back` in the step records)
    group = launch_servers(model_dir(args.model), num_servers=2, kind="sglang", python=python, timeout_s=1200,
                           env={**os.environ, "HF_HUB_OFFLINE": "1"}, extra_args=extra, log_dir=out / "servers")
    group.__enter__()
    return list(group.urls), group


def fit_policies(text: str) -> str:
    """--fit-policy: policies among sync, tail and sorted, comma-separated, each once."""
    policies = text.split(",")
    wrong = [p for p in policies if p not in ("sync", "tail", "sorted")]
    if wrong or len(set(policies)) != len(policies):
        raise argparse.ArgumentTypeError(f"{text!r}: sync, tail or sorted, comma-separated, each once"
                                         + (f" ({wrong[0]!r} is none of them)" if wrong else ""))
    return text


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="<= 4 minutes: " + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items()))
    ap.add_argument("--engine", choices=("embedded", "sglang"), default="embedded")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="the embedded engine's and trainer's device")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default=None, help="default: bfloat16 on cuda, else float32")
    ap.add_argument("--model", default="tiny", help="tiny (a random 2-layer Llama), default (SmolLM2-135M-Instruct) or a directory")
    ap.add_argument("--workload", default="servegen-r1", help="the check workload (a built-in trace)")
    ap.add_argument("--fit-workload", default="azure-conv", help="the workload of the run that fits the live path's "
                    "share of a decode step (step_s) and the scorer's latency")
    ap.add_argument("--fit-scale-from", type=int, default=1000, help="fit workload's trace tokens that map to "
                    "--max-tokens (azure-conv's cap is 1000)")
    ap.add_argument("--fit-policy", type=fit_policies, default="sync", help="the fit run's policy, or several "
                    "comma-separated (a fit run each, their rounds fitted together): tail rounds differ in their "
                    "finished requests (short and long rounds), so a finished request's live cost (event_s) is fitted "
                    "beside a launch's and a decode step's; sorted: its refills also make the launches differ from "
                    "the finishes (submit_s); sync: those two only")
    ap.add_argument("--train-beside", action="store_true", help="train beside the rollout, on the engine's cores "
                    "(the live term is then fitted per finished request); default: after the round")
    ap.add_argument("--policies", default="sync,tail,sorted")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=8, help="steps a run (step 0 is a warm-up, left out)")
    ap.add_argument("--fit-steps", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--scale-from", type=int, default=8192, help="trace tokens that map to --max-tokens")
    ap.add_argument("--capacity", type=int, default=64, help="engine rows (SGLang: over both servers)")
    ap.add_argument("--grid", choices=tuple(GRIDS), default="full", help="calibration grid")
    ap.add_argument("--profile", default=None, help="use this engine profile instead of calibrating")
    ap.add_argument("--out", default=None)
    ap.add_argument("--report", default=None, metavar="DIR", help="the tables again from DIR/result.json (or a result file)")
    ap.add_argument("--repredict", action="store_true", help="with --report: predict again with this tree's simulator")
    ap.add_argument("--refit", action="store_true", help="with --report: fit the profile again from DIR's measurements "
                    "(the grid it kept, DIR/fit/metrics.jsonl), then predict again")
    ap.add_argument("--refit-forwards", action="store_true", help="with --refit: take the decode steps the calibration "
                    "timed alone even where it chose a line in rows (the one that explained its grid better)")
    ap.add_argument("--write-results", action="store_true")
    ap.add_argument("--save", default=None, metavar="FILE", help="also write the result (as reported) to FILE")
    if "--quick" in (sys.argv[1:] if argv is None else argv):
        ap.set_defaults(**QUICK)  # the quick sizes, unless a flag says otherwise
    args = ap.parse_args(argv)
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    if args.engine == "sglang" and args.device != "cpu":
        ap.error("--engine sglang runs the servers on this machine's CPU here: --device cpu")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    report_file = Path(args.report or ".") / "result.json" if args.report and Path(args.report).is_dir() else args.report
    result = json.loads(Path(report_file).read_text()) if args.report else run(args)
    if args.refit:
        result = refit(result, Path(args.report), forwards=args.refit_forwards)
    if args.repredict or args.refit:
        result = repredict(result, Path(tempfile.mkdtemp(prefix="rollpacker-repredict-")))
    if args.save:
        Path(args.save).write_text(json.dumps(result, indent=1) + "\n")
    text = report(result)
    print(text)
    if args.write_results:
        subsection = f"{result['profile']['engine']}, {result['args']['model']} model"
        write_section(SECTION, text, subsection=subsection)
    policies = result["args"]["policies"].split(",")
    if "sync" in policies and len(policies) > 1:  # the headline is a ratio against sync
        print(headline(result, next(p for p in policies if p != "sync")))


if __name__ == "__main__":
    main()
