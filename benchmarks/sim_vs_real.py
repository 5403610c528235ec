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
   `--fit-policy`, default sync), whose rounds, beside their prediction, give the live path's time a
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

import attrs

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from results_md import write_section  # noqa: E402
from sim_vs_real_calibrate import GRIDS, calibrate, calibrate_trainer, machine, model_dir, shared_prefill  # noqa: E402
from sim_vs_real_report import headline, profile_line, report, round_rows, streams_training  # noqa: E402

from rollpacker.core import BatcherConfig  # noqa: E402
from rollpacker.sim.config import SimConfig  # noqa: E402
from rollpacker.sim.constants import SimConstants  # noqa: E402
from rollpacker.sim.engine_profile import EngineProfile, Run, fit_event_s, fit_live_terms, fit_profile, fit_return_s  # noqa: E402
from rollpacker.sim.simulation import Simulation  # noqa: E402

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


def dataset_size(args) -> int:
    return 8 * args.prompts


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


# -- the other stages, fitted -------------------------------------------------------------------------

@attrs.frozen
class Workload:
    """A built-in trace and the trace tokens that map to --max-tokens."""

    name: str
    scale_from: int


PROBE_S = 1e-3
"""The step_s and launch_s of the fit's probe predictions: the seconds each adds to a round, over it, are the
round's decode steps and its launch waits."""


def with_live_term(args, profile: EngineProfile, out: Path, fit_records: list[dict], stages: dict,
                   micro_batch_tokens: int) -> EngineProfile:
    """The profile with the live path's extra time fitted on the fit run's rounds (beside their prediction
    without it), saved as `out`/profile.json: where training waits for the round (colocated), `fit_time_terms`
    and, on SGLang where the fit rounds differ in their finished requests (`--fit-policy tail`), `return_s` an
    answer's way back, from the rounds' generated tokens (the requests decode on while an answer travels; the
    time terms fitted again with it); `event_s` alone where the trainer trains beside the rollout (its
    micro-batches follow the finished requests)."""
    def fit(candidate: EngineProfile) -> list[dict]:  # the fit run's steps, predicted with `candidate`
        return predict(args, out / "profile.json", fit_policy(args), 0, Workload(args.fit_workload, args.fit_scale_from),
                       len(fit_records), stages, micro_batch_tokens, 2 if args.engine == "sglang" else 1, candidate)

    measured, rounds = [r["rollout_s"] for r in fit_records[1:]], fit_records[1:]
    if streams_training(args):
        plain = [g["rollout_s"] for g in fit(attrs.evolve(profile, launch_s=0.0, step_s=0.0, event_s=0.0))[1:]]
        profile = attrs.evolve(profile, step_s=0.0, launch_s=0.0, event_s=fit_event_s(
            list(zip(measured, map(finished, rounds))), plain))
    else:
        profile = fit_time_terms(args, profile, fit, measured, rounds)
        if args.engine == "sglang" and len({finished(r) for r in rounds}) > 1:
            tokens = {c: [g["generated_tokens"] for g in fit(attrs.evolve(profile, return_s=c))[1:]] for c in RETURNS}
            returned = fit_return_s([sum(q[1] for q in r["requests"]) for r in rounds], tokens)
            profile = fit_time_terms(args, attrs.evolve(profile, return_s=returned), fit, measured, rounds)
    profile.save(out / "profile.json")
    return profile


RETURNS = tuple(i * 0.01 for i in range(16))
"""The answer's way back (`return_s`) tried against the fit rounds' generated tokens: 0-150 ms."""


def fit_time_terms(args, profile: EngineProfile, fit, measured: list[float], rounds: list[dict]) -> EngineProfile:
    """`profile` with the live terms fitted by least squares on the fit `rounds`' `measured` rollout seconds, from
    `fit`'s predictions with none and with a probe of each: `launch_s` a launch (SGLang: the submission's way in),
    `step_s` a decode step (the driver sharing the engine's cores) and, where the rounds differ in their finished
    requests, `event_s` a finished request, and on SGLang where they differ in their launches, `submit_s` a
    launched request."""
    guesses, zero = [], {"launch_s": 0.0, "step_s": 0.0, "event_s": 0.0, "submit_s": 0.0}
    for probe in ({}, *({term: PROBE_S} for term in zero)):
        guesses.append([g["rollout_s"] for g in fit(attrs.evolve(profile, **{**zero, **probe}))[1:]])
    launches, steps, events, submits = ([(probed - plain) / PROBE_S for plain, probed in zip(guesses[0], g)]
                                        for g in guesses[1:])
    sglang = args.engine == "sglang"  # (the embedded engine is called in-process: no submission path to pay)
    live = fit_live_terms(measured, guesses[0], launches if sglang else [0.0] * len(launches), steps,
                          events if len({finished(r) for r in rounds}) > 1 else None,
                          submits if sglang and len({len(r["requests"]) for r in rounds}) > 1 else None)
    return attrs.evolve(profile, **{**zero, **live})


def fit_policy(args) -> str:
    """The fit run's policy (a result measured before --fit-policy existed used sync)."""
    return getattr(args, "fit_policy", None) or "sync"


def finished(record: dict) -> int:
    """Requests of a step that finished (not aborted)."""
    return sum(1 for q in record["requests"] if q[2] != "abort")


def fit_round(record: dict) -> dict:
    """What the live terms' fit reads of a fit run's step record (kept in the result)."""
    return {"rollout_s": record["rollout_s"], "requests": [q[:3] for q in record["requests"]]}


def refit(result: dict, out: Path) -> dict:
    """`result` with its profile fitted again by this tree's model from its own measurements: the calibration
    grid it kept and the fit run's rounds it kept (a result measured before they were kept: the fit run's step
    records in `out`/fit), after a change to the latency model's terms."""
    args = argparse.Namespace(**result["args"])
    old = EngineProfile(**result["profile"])
    runs = [Run(*r) for r in old.fit["runs"]]
    profile = fit_profile(runs, engine=old.engine, model=old.model, machine=old.machine, date=old.date,
                          max_running=old.max_running, kv_capacity=old.kv_capacity, abort_s=old.abort_s,
                          abort_request_s=old.abort_request_s, aborts=old.fit.get("aborts"),
                          admit_fraction=old.admit_fraction, shared_prefill=shared_prefill(args))
    records = result.get("fit_rounds") or [fit_round(json.loads(line))
                                           for line in (out / "fit" / "metrics.jsonl").read_text().splitlines()]
    profile = with_live_term(args, profile, Path(tempfile.mkdtemp(prefix="rollpacker-refit-")), records,
                           result["stages"], result["micro_batch_tokens"])
    return {**result, "profile": profile.to_dict(), "refit": True}


def sim_constants(stages: dict, stream: bool = False) -> SimConstants:
    """The simulator's constants of the measured run: colocated training with the calibrated trainer, the
    scorer's measured latency, the live path's reward settings, no KV watermark (the engine keeps none)."""
    c = SimConstants()
    train = {k: stages[k] for k in ("micro_batch_overhead_s", "seconds_per_padded_token", "seconds_per_token",
                                    "optimizer_s")}
    return attrs.evolve(
        c, train=attrs.evolve(c.train, stream=stream, **train),
        reward=attrs.evolve(c.reward, median_s=stages["reward_median_s"], sigma=0.0, hang_rate=0.0, burst_workers=0,
                            workers=1, hedge_after=2.0, hedge_copies=1),
        engine=attrs.evolve(c.engine, admit_watermark=0.0))


# -- prediction -----------------------------------------------------------------------------------------

def predict(args, profile_path: Path, policy: str, seed: int, workload: Workload, steps: int, stages: dict,
            micro_batch_tokens: int, instances: int, profile: EngineProfile | None = None) -> list[dict]:
    """Part 4: the simulator's steps of the same run (with `profile` saved as `profile_path` first, if given)."""
    from rollpacker.train.replay import ReplayOptions

    if profile is not None:
        profile.save(profile_path)

    config = SimConfig(workload=workload.name, policy=policy, prompts=args.prompts, samples=args.samples,
                       max_tokens=args.max_tokens, steps=steps, seed=seed, instances=instances,
                       dataset_prompts=dataset_size(args), scale_from=workload.scale_from,
                       engine_profile=str(profile_path), bubble_capacity=args.capacity)
    lengths = prompt_lengths(args, seed)
    replay = ReplayOptions(replay_lengths=workload.name, replay_scale_from=workload.scale_from)
    sim = Simulation(config, sim_constants(stages, stream=streams_training(args)), workload=replay.workload(len(lengths), lengths, seed, args.max_tokens),
                     batcher=BatcherConfig(token_budget=micro_batch_tokens))
    return sim.run()["steps"]


_PROMPTS: dict = {}


def prompt_lengths(args, seed: int) -> list[int]:
    """The token lengths of the run's dataset prompts, as the reference trainer renders them."""
    key = (args.model, seed, dataset_size(args))
    if key not in _PROMPTS:
        from rollpacker.train.config import parse
        from rollpacker.train.prompts import load_prompts

        config = parse(["--seed", str(seed), "--dataset-size", str(dataset_size(args)), "--max-tokens",
                        str(args.max_tokens), "--prompts", str(args.prompts)])
        prompts = load_prompts(config, Path(model_dir(args.model)))
        _PROMPTS[key] = [len(prompts.prompt_ids(i)) for i in range(len(prompts))]
    return _PROMPTS[key]


def repredict(result: dict, out: Path) -> dict:
    """`result` with every predicted figure made again by this tree's simulator, from the profile and stages it
    was measured with (the measured figures as they were): after a change to the latency model."""
    args = argparse.Namespace(**result["args"])
    profile_path = out / "profile.json"
    EngineProfile(**result["profile"]).save(profile_path)
    check, instances = Workload(args.workload, args.scale_from), 2 if args.engine == "sglang" else 1
    runs = []
    for policy, seed, rows in result["runs"]:
        sim = predict(args, profile_path, policy, seed, check, args.steps, result["stages"],
                      result["micro_batch_tokens"], instances)
        runs.append((policy, seed, [{**row, **{k: (row[k][0], v[k][1]) for k in v if k in MEASURED_PAIRS and k in row},
                                     "sim_round": v["sim_round"]}
                                    for row, v in zip(rows, round_rows(sim, sim))]))
    return {**result, "runs": runs}


MEASURED_PAIRS = ("rollout", "step_s", "train", "longest", "bubble", "wasted")
"""The (measured, predicted) pairs of a round's row."""


# -- main -------------------------------------------------------------------------------------------------

def run(args) -> dict:
    out = Path(args.out or tempfile.mkdtemp(prefix="rollpacker-sim-vs-real-"))
    out.mkdir(parents=True, exist_ok=True)
    urls, servers = start_servers(args, out)
    try:
        profile = calibrate(args, out, urls)
        fit = Workload(args.fit_workload, args.fit_scale_from)
        fit_records, tokens = real_run(args, fit_policy(args), 0, fit, args.fit_steps, out / "fit", urls)
        stages = calibrate_trainer(args, tokens)
        stages |= {"reward_median_s": max(statistics.median(r["reward_latency_s_mean"] for r in fit_records[1:]), 1e-4),
                   "optimizer_s": stages["optimizer_s"] + statistics.median(r["sync_s"] for r in fit_records[1:])}
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
    extra = ("--max-total-tokens", str(16384), "--max-running-requests", str(args.capacity // 2))
    group = launch_servers(model_dir(args.model), num_servers=2, kind="sglang", python=python, timeout_s=1200,
                           env={**os.environ, "HF_HUB_OFFLINE": "1"}, extra_args=extra, log_dir=out / "servers")
    group.__enter__()
    return list(group.urls), group


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
    ap.add_argument("--fit-policy", choices=("sync", "tail", "sorted"), default="sync", help="the fit run's policy: tail "
                    "rounds differ in their finished requests (short and long rounds), so a finished request's "
                    "live cost (event_s) is fitted beside a launch's and a decode step's; sorted: its refills "
                    "also make the launches differ from the finishes (submit_s); sync: those two only")
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
        result = refit(result, Path(args.report))
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
