"""Fidelity: does tail batching learn what sync learns?  Reward curves of policies from the same
weights, seed and data order: sync; RollPacker tail at its default knobs; tail with unbiased groups
(--tail.eta-responses 1.0).  The settings (benchmarks/fidelity_settings.py) `cpu-tost` and `gpu-tost`
carry a pre-registered design: sync and tail on 4 paired seeds, tested for equivalence
(benchmarks/fidelity_equivalence.py).  The one driver of these runs (benchmarks/gpu_campaign.py's
fidelity part calls it with the `gpu-tost` setting).

    nice -n 19 python benchmarks/fidelity.py --setting cpu-tost &   # CPU: advance every run, one at a time; resumable
    python benchmarks/fidelity.py --setting cpu-tost --report       # the plot and the RESULTS.md section only
    python benchmarks/fidelity.py --setting gpu-tost --budget-s 420 # one GPU call (gpu_campaign.py)

Each run is `reference/train.py` with the setting's flags (SETTINGS), its policy, its --seed and
--eval-every: a held-out set scored greedily every few steps, outside the timed steps
(rollpacker/train/evaluation.py).  One run trains at a time: for each seed, sync, tail, tail-unbiased,
each to the end, or with --chunk N each N steps in turn (so that a cut leaves curves of equal length;
each turn starts the trainer again, a minute or two on a loaded CPU).

Where things are:
- the run directories (weights, optimizer state: about 1.7 GB each for the default model) under
  --state (default: the rollpacker cache folder, fidelity/SETTING/), never in git;
- each run's small metrics, copied there while it trains (every --copy-every-s seconds and when it
  ends) with per-request detail dropped: benchmarks/fidelity/SETTING/POLICY/seedK/{metrics,eval}.jsonl,
  and the setting's flags in setting.json: these are committed, and the plot (benchmarks/fidelity.png)
  and the table are made from them alone.

Resuming: a run whose state is still in --state continues from its last saved step (train.py --resume;
an interrupted step is played again), so a run killed at any moment, or cut at --budget-s, goes on at
the next call.  A run whose state is gone (a fresh machine) but whose committed metrics stop short
cannot continue, its weights being lost: it is skipped with a line saying so, its partial curve still
plotted as partial; --restart-lost trains it again from step 0 (its committed metrics are replaced).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from attrs import frozen

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from fidelity_settings import POLICIES, SETTINGS  # noqa: E402  (gpu_campaign.py reads SETTINGS here)
from results_md import RESULTS  # noqa: E402

KEPT_FIELDS = ("step", "round", "mean_reward", "mean_kept_length", "mean_generated_length", "step_s", "rollout_s",
               "reward_s", "train_s", "kept_tokens", "generated_tokens", "wasted_tokens", "launched_requests",
               "trained_prompts", "nonzero_variance_groups", "on_policy_fraction", "loss", "entropy", "grad_norm",
               "bubble_ratio", "reward_failures", "device")
"""What the committed metrics keep of a step record (its per-request lists would be most of the bytes)."""


@frozen
class Run:
    policy: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.policy}/seed{self.seed}"


def parse_args(argv: list[str]) -> argparse.Namespace:
    from rollpacker.backends.models import cache_dir

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setting", default="cpu-tost", choices=sorted(SETTINGS), help="sizes of the runs (SETTINGS)")
    ap.add_argument("--seeds", default=None, help="comma-separated seeds, each runs every policy (default: the setting's)")
    ap.add_argument("--policies", default=None, help=f"comma-separated, of {', '.join(POLICIES)} (default: the setting's)")
    ap.add_argument("--steps", type=int, default=None, help="steps of each run (default: the setting's)")
    ap.add_argument("--chunk", type=int, default=None,
                    help="steps a run trains before the next run of its seed takes a turn (default: all at once)")
    ap.add_argument("--report", action="store_true", help="no training: the plot and the table from the metrics")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="stop training after this many seconds (the run in progress is stopped, and resumes next call)")
    ap.add_argument("--restart-lost", action="store_true",
                    help="train again from step 0 a run whose state is gone but whose metrics stop short")
    ap.add_argument("--copy-every-s", type=float, default=30.0, help="how often a running run's metrics are copied")
    ap.add_argument("--model", default=None, help="HF model directory (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--device", default="cpu", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--trainer", default=None, help="train.py --trainer (default: train.py's)")
    ap.add_argument("--state", type=Path, default=None, help="run directories (default: CACHE/fidelity/SETTING)")
    ap.add_argument("--metrics", type=Path, default=None, help="committed metrics (default: benchmarks/fidelity/SETTING)")
    ap.add_argument("--plot", type=Path, default=None,
                    help="default: benchmarks/fidelity.png for the cpu setting, benchmarks/fidelity-SETTING.png else")
    ap.add_argument("--results", type=Path, default=RESULTS, help="RESULTS.md to write the section into")
    ap.add_argument("--log", type=Path, default=None, help="append the runs' output here (default: STATE/train.log)")
    args = ap.parse_args(argv)
    if args.chunk is not None and args.chunk < 1:
        ap.error(f"--chunk must be >= 1, got {args.chunk}")
    setting = SETTINGS[args.setting]
    args.seeds = args.seeds or ",".join(map(str, setting.seeds))
    args.policies = args.policies or ",".join(setting.policies)
    args.seed_list = [int(s) for s in args.seeds.split(",") if s.strip()]
    args.policy_list = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in args.policy_list if p not in POLICIES]
    if bad:
        ap.error(f"--policies: unknown {', '.join(bad)}; choose from {', '.join(POLICIES)}")
    args.steps = args.steps or SETTINGS[args.setting].steps
    args.state = args.state or cache_dir() / "fidelity" / args.setting
    args.metrics = args.metrics or ROOT / "benchmarks" / "fidelity" / args.setting
    args.log = args.log or args.state / "train.log"
    suffix = "" if args.setting == "cpu" else f"-{args.setting}"
    args.plot = args.plot or ROOT / "benchmarks" / f"fidelity{suffix}.png"
    return args


def runs_of(args: argparse.Namespace) -> list[Run]:
    return [Run(policy, seed) for seed in args.seed_list for policy in args.policy_list]


def setting_record(args: argparse.Namespace) -> dict:
    setting = SETTINGS[args.setting]
    return {"setting": args.setting, "flags": list(setting.flags), "steps": args.steps, "what": setting.what,
            "why": setting.why, "design": setting.design, "seeds": list(setting.seeds), "control": list(setting.control),
            "model": args.model, "device": args.device, "trainer": args.trainer}


def check_setting(args: argparse.Namespace) -> None:
    """The metrics folder holds runs of this setting's flags only: another one is refused in one line."""
    path = args.metrics / "setting.json"
    mine = setting_record(args)
    if path.exists():
        theirs = json.loads(path.read_text())
        changed = [k for k in ("flags", "model", "trainer") if theirs.get(k) != mine[k]]
        if changed:
            print(f"error: {path} holds runs made with another {', '.join(changed)} ({theirs}); pass another "
                  f"--metrics, or remove that folder to start over", file=sys.stderr)
            raise SystemExit(2)
        mine["steps"] = max(mine["steps"], theirs.get("steps", 0))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(mine, indent=1) + "\n")


# -- training --------------------------------------------------------------------------------------

def resumable(state: Path) -> bool:
    """A run's directory holds a saved state to resume from."""
    from rollpacker.train.outputs import RunDir

    return state.exists() and RunDir(state).saved_step() is not None


def train_command(run: Run, args: argparse.Namespace, target: int) -> list[str] | None:
    """train.py's command line that takes `run` to `target` steps: a resume when its state is there, a
    fresh run when nothing of it exists (or --restart-lost); None when its state is lost."""
    state, metrics = args.state / run.policy / f"seed{run.seed}", args.metrics / run.policy / f"seed{run.seed}"
    if resumable(state):
        return [sys.executable, "reference/train.py", "--resume", str(state), "--steps", str(target)]
    if committed_steps(metrics) and not args.restart_lost:
        print(f"{run.name}: its state is gone from {state} (a fresh machine?), its committed metrics stop at step "
              f"{committed_steps(metrics)}: it cannot continue; --restart-lost trains it again from step 0",
              flush=True)
        return None
    shutil.rmtree(state, ignore_errors=True)  # a first call killed before its first save, or --restart-lost
    shutil.rmtree(metrics, ignore_errors=True)
    extra = [flag for name in ("model", "trainer") if getattr(args, name) for flag in (f"--{name}", getattr(args, name))]
    return [sys.executable, "reference/train.py", *SETTINGS[args.setting].flags, *POLICIES[run.policy],
            "--seed", str(run.seed), "--steps", str(target), "--device", args.device, *extra, "--out", str(state)]


def advance(run: Run, args: argparse.Namespace, deadline: float | None) -> str:
    """Train `run` --chunk steps further, to at most --steps (or until `deadline`, time.monotonic()),
    copying its metrics as it goes; "complete" (--steps done), "advanced" (its chunk done), "stopped"
    (deadline), "lost" (state gone), or "failed: ..." naming the log."""
    state, metrics = args.state / run.policy / f"seed{run.seed}", args.metrics / run.policy / f"seed{run.seed}"
    done = committed_steps(metrics)
    if done >= args.steps:
        return "complete"
    if args.restart_lost and not resumable(state):
        done = 0  # trained again from step 0, a chunk at a time like the others (its metrics are replaced)
    target = min(args.steps, done + args.chunk) if args.chunk else args.steps
    cmd = train_command(run, args, target)
    if cmd is None:
        return "lost"
    args.log.parent.mkdir(parents=True, exist_ok=True)
    with args.log.open("a") as log:
        log.write(f"\n$ {' '.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        stopped = watch(proc, state, metrics, args.copy_every_s, deadline)
    copy_metrics(state, metrics)
    if stopped:
        return "stopped"
    if proc.returncode != 0:
        return f"failed: exit status {proc.returncode}; its output is in {args.log}"
    done = committed_steps(metrics)
    return "complete" if done >= args.steps else "advanced" if done >= target else f"failed: it stopped at step {done}"


def watch(proc: subprocess.Popen, state: Path, metrics: Path, every_s: float, deadline: float | None) -> bool:
    """Wait for the trainer, copying its metrics every `every_s`; at `deadline` stop it as Ctrl-C would
    (SIGTERM: it ends between saves, resumable) and return True."""
    while True:
        wait = every_s if deadline is None else min(every_s, max(0.0, deadline - time.monotonic()))
        try:
            proc.wait(timeout=wait)
            return False
        except subprocess.TimeoutExpired:
            copy_metrics(state, metrics)
        if deadline is not None and time.monotonic() >= deadline:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)  # it finishes the save in progress first (a kill mid-save is safe too)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            return True


def copy_metrics(state: Path, metrics: Path) -> None:
    """The run's metrics.jsonl (KEPT_FIELDS of each step) and eval.jsonl into `metrics`, each
    replaced whole (a commit made meanwhile sees the old file or the new one)."""
    from rollpacker.train.outputs import read_jsonl

    metrics.mkdir(parents=True, exist_ok=True)
    steps = [{k: r[k] for k in KEPT_FIELDS if k in r} for r in read_jsonl(state / "metrics.jsonl")]
    for name, records in (("metrics.jsonl", steps), ("eval.jsonl", read_jsonl(state / "eval.jsonl"))):
        tmp = metrics / f".{name}.tmp"
        tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
        os.replace(tmp, metrics / name)


def committed_steps(metrics: Path) -> int:
    from rollpacker.train.outputs import read_jsonl

    return len(read_jsonl(metrics / "metrics.jsonl"))


def advance_all(args: argparse.Namespace) -> dict[str, str]:
    """For each seed in turn, its runs (one at a time, --chunk steps each in turn, so their curves grow
    together) to --steps, until --budget-s is spent; run name -> its last outcome."""
    check_setting(args)
    deadline = None if args.budget_s is None else time.monotonic() + args.budget_s
    outcomes: dict[str, str] = {}
    for seed in args.seed_list:
        runs = [Run(policy, seed) for policy in args.policy_list]
        while any(outcomes.get(run.name, "advanced") == "advanced" for run in runs):
            for run in (r for r in runs if outcomes.get(r.name, "advanced") == "advanced"):
                if deadline is not None and deadline - time.monotonic() < 30:
                    outcomes[run.name] = "not finished (budget spent)"
                    continue
                start = time.monotonic()
                outcomes[run.name] = advance(run, args, deadline)
                print(f"{run.name}: {outcomes[run.name]} at step "
                      f"{committed_steps(args.metrics / run.policy / f'seed{run.seed}')} of {args.steps} "
                      f"({time.monotonic() - start:.0f} s)", flush=True)
    return outcomes


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    setting = SETTINGS[args.setting]
    print(f"fidelity, setting {args.setting}: {setting.what}; {len(args.policy_list)} policies "
          f"({', '.join(args.policy_list)}) x seeds {args.seeds}, {args.steps} steps each; runs in {args.state}, "
          f"metrics in {args.metrics}", flush=True)
    if args.report:
        check_setting(args)  # (its record, rewritten: the setting's words may be newer than the runs)
    outcomes = {} if args.report else advance_all(args)
    from fidelity_report import report

    summary = report(args.metrics, args.plot, args.results, runs_of(args), args.steps)
    print(summary["text"], flush=True)
    failed = [name for name, outcome in outcomes.items() if outcome.startswith("failed")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
