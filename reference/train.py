"""rollpacker reference trainer: GRPO-style RL post-training with tail batching, end to end.

    make train                                     # SmolLM2-135M-Instruct on CPU, ~14 minutes on 2 cores
    python reference/train.py --steps 20 --policy sorted --out runs/sorted
    python reference/train.py --compare sync,tail --out runs/compare
    python reference/train.py --dataset data.parquet --reward math   # your data (veRL layout): docs/your-data.md
    python reference/train.py --resume runs/latest  # after a kill, at any point
    python reference/train.py --nproc 2             # trainer under torchrun (FSDP2), rank 0 drives
    python reference/train.py --help                # every flag, with its default

Each step: the planner launches a round on the rollout engine; finished samples are scored in
worker processes as they arrive; complete groups are trained as micro-batches while the rest of
the round still generates; one optimizer step; the new weights go to the engine.  The scheduling
logic lives in rollpacker.core, the I/O in rollpacker.backends; this file only wires them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
from pathlib import Path


def missing_package(exc: ModuleNotFoundError) -> int:
    """A package this script needs is not installed: one line naming the pip install, exit 2."""
    if exc.name == "rollpacker":
        line = "needs the rollpacker package, which is not installed here: pip install -e '.[train]' in the repository (or make train)"
    else:
        from rollpacker.extras import missing_package_line

        line = missing_package_line(exc, "train")
        if line is None:  # one of our own modules: a bug, show it whole
            raise exc
    print(f"error: reference/train.py {line}", file=sys.stderr)
    return 2


try:
    from rollpacker.core.errors import BackendError, ConfigError, RollpackerError
    from rollpacker.plugins import SAVED_KEY
    from rollpacker.train.config import SECTIONS, RunConfig, parse
    from rollpacker.train.launch import launch_local
    from rollpacker.train.nodes import start_ranks
    from rollpacker.train.outputs import LOCK_HOLDER_ENV, RunDir
    from rollpacker.train.progress import Phases, StageBars, epoch_line, step_line
    from rollpacker.train.ranks import on_rank0
    from rollpacker.train.run_paths import absolute_paths, followed, link_latest, new_run_path
    from rollpacker.train.registry import check_registered
    from rollpacker.train.session import Session, follower_main, init_distributed_env
except ModuleNotFoundError as _exc:
    sys.exit(missing_package(_exc))
except RollpackerError as _exc:  # e.g. a plugin module of $ROLLPACKER_PLUGINS that does not import
    print(f"error: {_exc}", file=sys.stderr)
    sys.exit(2)


class Terminated(KeyboardInterrupt):
    """SIGTERM, taken as Ctrl-C is: the run stops between saves, with a line saying how to go on."""


def _terminated(signum, frame):
    raise Terminated


def main(argv: list[str]) -> int:
    # Ctrl-C stops the run even when a script or a CI runner started it in the background, SIGINT ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    config = parse(argv)
    rank, world = init_distributed_env()
    fresh = config.resume is None and "out" not in given_flags(argv)
    if fresh:  # each run a directory of its own, runs/latest linked to the newest (docs/reference-trainer.md: make train)
        if world > 1:
            raise ConfigError("under torchrun every rank must write to the same run directory: name it with --out")
        config.out = new_run_path()
        argv = [*argv, "--out", str(config.out)]  # --nproc's ranks write there too
    if config.resume is None:
        absolute_paths(config)  # kept as the run's config: a resume from another directory finds them
    if world > 1:  # under torchrun, on one node or several (docs/multi-node.md)
        config.check_dist_timeout()  # the process group's timeout, before it is made
        start_ranks(config.resume or config.out, "--resume" if config.resume else "--out", config.dist_timeout_s)
    if config.resume is not None:  # one trainer per directory, and its state whole, before anything is read from it
        on_rank0(lambda: RunDir(config.resume).lock("--resume").check_state())
        config = dataclasses.replace(resumed_config(config, argv), dist_timeout_s=config.dist_timeout_s)
    if world > 1:
        config.nproc = world  # torchrun's nodes x processes per node (it refuses a --nproc after the script)
    config.validate()  # bad flags fail here, before any model is loaded

    if not on_rank0(lambda: ready_to_train(config, link=fresh)):  # rank 0's checks of --out stop every rank alike
        return 0
    if rank > 0:
        follower_main(config)
        return 0
    run_dir = RunDir(config.out).lock()  # held since ready_to_train
    signal.signal(signal.SIGTERM, _terminated)
    try:
        if config.nproc > 1 and world == 1:  # re-launch ourselves under torchrun (which owns --nproc*)
            rest = [a for i, a in enumerate(argv) if not a.startswith("--nproc") and not (i and argv[i - 1] == "--nproc")]
            return launch_local(config.nproc, __file__, rest, {LOCK_HOLDER_ENV: str(os.getpid())})
        if config.compare:
            return compare(config)
        train(config, run_dir, resume=config.resume is not None)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: one line, no traceback (reward workers ignore both)
        print(interrupted_line(config, run_dir, "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"),
              file=sys.stderr)
        return 143 if isinstance(exc, Terminated) else 130
    except BackendError as exc:  # e.g. the only rollout server died mid-round: the saved state resumes
        step = None if config.compare else run_dir.saved_step()
        raise BackendError(f"{exc}" + (f" (--resume {run_dir.path} continues from step {step} once it is fixed)"
                                    if step is not None else "")) from exc
    print(f"\noutputs in {run_dir.path}/: metrics.jsonl, tensorboard/, timeline.png, summary.png, "
          f"checkpoints/ (HF safetensors), state/ (resume with --resume {run_dir.path})")
    return 0


def ready_to_train(config: RunConfig, link: bool = False) -> bool:
    """Rank 0 takes --out (not writable, or in use: one line naming it, before any model loads),
    checks the other directories it will write, and says whether there is a step to train; a run
    without --out then becomes runs/latest (`link`)."""
    run_dir = RunDir(config.out).lock()
    note = link_latest(run_dir.path) if link else None
    if note:
        print(note)
    if not has_work(config, run_dir):
        return False
    if config.rollout == "sglang":  # --weight-sync disk:DIR can be written
        config.rollout_options().check_weights_dir()
    run_dir.check_dataset(config.dataset, resume=config.resume is not None)
    return True


def has_work(config: RunConfig, run_dir: RunDir) -> bool:
    """A new run needs an unused directory (and --compare unused ones per policy); a resumed one
    needs steps left to train."""
    if config.resume is None:
        policy_dirs = [RunDir(run_dir.path / name) for name in config.compare_policies()] if config.compare else []
        for used in (d for d in (run_dir, *policy_dirs) if d.holds_a_run()):
            raise ConfigError(f"--out {used.path} already holds a run; continue it with --resume {used.path} "
                              f"or start a new one with a fresh --out")
        return True
    done = run_dir.saved_step()
    if done is not None and done >= config.steps:
        print(f"{run_dir.path} has trained {done} steps already (--steps {config.steps}): nothing to do; "
              f"--steps {done + 1} or more trains further")
        return False
    return True


def interrupted_line(config: RunConfig, run_dir: RunDir, what: str = "interrupted") -> str:
    if config.compare:
        return f"{what}; --compare runs do not resume: run it again with a fresh --out"
    step = run_dir.saved_step()
    if step is None:
        return f"{what} before the first state was saved; nothing to resume in {run_dir.path}"
    return f"{what} at step {step}; --resume {run_dir.path} continues"


RESUME_MAY_CHANGE = ("resume", "preset", "steps", "step_timeout_s", "device", "cuda_graphs", "allow_failed_rewards",
                     "dist_timeout_s")
"""Flags a resume takes from the command line; every other one comes from the saved config."""


def resumed_config(flags: RunConfig, argv: list[str]) -> RunConfig:
    """The saved config of the run being resumed; --steps may change how far it goes, and a flag
    that would change the run (--policy, --lr, ...) is refused rather than ignored."""
    saved = RunDir(flags.resume).load_config_dict()
    check_registered(saved, f"--resume {flags.resume}")  # a plugin's policy, engine or trainer: its module imported
    config = parse(["--preset", "smollm2_cpu_tail"])  # typed defaults, then the saved values
    for key, value in saved.items():
        if key == SAVED_KEY:
            continue
        if key in SECTIONS:  # a knob the saved run predates takes the default of its class
            value = SECTIONS[key](**value)
        elif key in ("out", "resume", "dataset") and value is not None:
            value = Path(value)
        elif isinstance(value, list):
            value = tuple(value)
        setattr(config, key, value)
    config.out = config.resume = followed(Path(flags.resume))  # runs/latest: the run it links to now
    absolute_paths(config)  # a run saved with relative paths: as its resume from here reads them
    absolute_paths(flags)
    given = given_flags(argv)
    for name in given - set(RESUME_MAY_CHANGE):
        old, new = _field(config, name), _field(flags, name)
        if new != old:
            raise ConfigError(f"--resume {flags.resume} keeps the run's saved config: --{name.replace('_', '-')} "
                              f"{new} differs from its {old} (only --steps may change; use a fresh --out for a new run)")
    for name in given & set(RESUME_MAY_CHANGE) - {"resume", "preset"}:
        setattr(config, name, getattr(flags, name))
    return config


def given_flags(argv: list[str]) -> set[str]:
    """Field names of the flags on the command line (`--tail.eta-prompts=2` -> tail.eta_prompts)."""
    names = {a[2:].split("=")[0].replace("-", "_") for a in argv if a.startswith("--")}
    return {n[3:] if n.startswith("no_") else n for n in names}


def _field(config: RunConfig, name: str):
    value = config
    for part in name.split("."):
        value = getattr(value, part, None)
    return value


def train(config: RunConfig, run_dir: RunDir, policy: str | None = None, resume: bool = False) -> list[dict]:
    bars = StageBars(config.prompts * config.samples, disable=not sys.stderr.isatty())
    phase = Phases()
    scheduler_state = run_dir.load_scheduler() if resume else None
    session = Session(config, run_dir, policy, scheduler_state, on_progress=bars.update, on_phase=phase)
    try:
        if resume:
            phase(f"loading the saved trainer state of {run_dir.path}")
            session.restore_trainer(run_dir.state_dir())
            run_dir.truncate_to(session.step)  # an interrupted step is played again
            print(f"resumed {run_dir.path} at step {session.step} with its saved config (only --steps may change)")
        else:
            phase(f"saving the initial state in {run_dir.path / 'state'} (a kill during step 0 resumes from it)")
            session.begin()  # the rollout on the initial weights, the state saved
        phase(f"policy {session.policy.name} on {session.device}: P={config.prompts} R={config.samples} "
              f"max_tokens={config.max_tokens}, {len(session.prompts)} prompts, model {session.model_dir}; step "
              f"{session.step} starts")
        note = epoch_line(session.policy.name, config.prompts, config.steps, len(session.prompts))
        if note:
            print(note, flush=True)
        session.evaluate_if_due()  # --eval-every: the weights before the first step (or a resumed one's, if missed)
        while session.step < config.steps:
            bars.begin_step(session.step)
            record = session.run_step()
            bars.close()
            print(step_line(record), flush=True)  # before any write: a signal or a full disk in the save keeps it
            run_dir.log_step(record)
            run_dir.plot_timeline(session.loop.last_timeline, record, session.engine.capacity)
            session.check_rewards(record)  # every reward failed: stop before the save, so a resume plays it again
            session.save()
            session.evaluate_if_due()  # after the save: a kill here re-evaluates on resume, retrains nothing
        session.save_hf()
        run_dir.plot_summary()
        return run_dir.records()
    finally:
        bars.close()
        session.close()


def compare(config: RunConfig) -> int:
    """Each policy from the same initial weights and seed; step-time ratio and reward curves."""
    results = {}
    subs = {name: dataclasses.replace(config, policy=name, compare=None, out=Path(config.out) / name)
            for name in config.compare_policies()}
    run_dirs = {name: RunDir(sub.out).lock() for name, sub in subs.items()}  # each policy's run is ours alone
    for name, sub in subs.items():
        print(f"\n== {name} ==")
        results[name] = train(sub, run_dirs[name], policy=name)
    summary = compare_summary(results)
    out = Path(config.out)
    (out / "compare.json").write_text(json.dumps(summary, indent=1))
    plot_compare(results, out / "compare.png")
    base, *others = summary["policies"]
    for other in others:
        print(f"{base}/{other} step-time ratio: {summary['step_time_ratio'][other]:.2f}x")
    print(f"compare.json and compare.png in {out}/")
    return 0


def compare_summary(results: dict[str, list[dict]]) -> dict:
    names = list(results)
    mean = lambda rs, key: sum(r[key] for r in rs) / len(rs)  # noqa: E731
    step_s = {n: mean(rs, "step_s") for n, rs in results.items()}
    kept = {n: sum(r["kept_tokens"] for r in rs) for n, rs in results.items()}
    off = {n: sum(r["offpolicy_tokens"] for r in rs) for n, rs in results.items()}
    return {
        "policies": names,
        "mean_step_s": step_s,
        "step_time_ratio": {n: step_s[names[0]] / step_s[n] for n in names[1:]},
        "bubble_ratio": {n: mean(rs, "bubble_ratio") for n, rs in results.items()},
        "mean_reward": {n: mean(rs, "mean_reward") for n, rs in results.items()},
        "on_policy_token_fraction": {n: 1 - off[n] / kept[n] if kept[n] else 1.0 for n in names},
        "reward_curves": {n: [r["mean_reward"] for r in rs] for n, rs in results.items()},
        "rounds": {n: [r["round"] for r in rs] for n, rs in results.items()},
    }


def plot_compare(results: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for name, records in results.items():
        top.plot([r["step"] for r in records], [r["step_s"] for r in records], marker="o", label=name)
        bottom.plot([r["step"] for r in records], [r["mean_reward"] for r in records], marker="o", label=name)
    top.set_ylabel("step seconds")
    bottom.set_ylabel("mean reward")
    bottom.set_xlabel("step")
    top.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except RollpackerError as exc:  # bad input: one clear line, no traceback
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except ModuleNotFoundError as exc:  # e.g. tyro or torch: the [train] extra is not installed
        sys.exit(missing_package(exc))
