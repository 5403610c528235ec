"""`rollpacker simulate` (also `python -m rollpacker.sim`): flags, validation, output."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import attrs

from rollpacker.core import POLICIES, ConfigError, Knob, knob_specs
from rollpacker.core.policies import policy_sections
from rollpacker.plugins import load_plugins

from .config import TP_MODES, SimConfig
from .constants import MODELS, SimConstants
from .simulation import Simulation
from .workloads import BUILTIN

TRUE, FALSE = ("on", "true", "1", "yes"), ("off", "false", "0", "no")


def on_off(raw: str) -> bool:
    """A boolean flag value: on/off, true/false, 1/0."""
    value = raw.lower()
    if value not in TRUE + FALSE:
        raise argparse.ArgumentTypeError(f"expected on or off, got {raw!r}")
    return value in TRUE


def knob_flags() -> dict[str, list[tuple[str, Knob]]]:
    """Every policy knob by name, with the policies that have it, read from the core's policy classes.
    The simulator's short knob flags are shared between policies: --staleness sets sorted's and partial's."""
    by_name: dict[str, list[tuple[str, Knob]]] = {}
    for section in policy_sections():
        for knob in section.knobs:
            by_name.setdefault(knob.name, []).append((section.name, knob))
    return by_name


def add_knob_arguments(p: argparse.ArgumentParser) -> None:
    """Each policy's section of knob flags, `--tail.eta-prompts`, titled and helped as the trainer's
    (rollpacker.core.policies.policy_sections); then the short spelling of each knob, `--eta-prompts`,
    which sets the knob of --policy (a bool takes on/off, alone it means on)."""
    for section in policy_sections():
        group = p.add_argument_group(f"{section.name} options", section.title)
        for knob in section.knobs:
            help = f"{knob.paragraph} (default: {knob.default})".replace("%", "%%")
            group.add_argument(f"--{section.name}.{knob.flag}", dest=f"{section.name}.{knob.name}", default=None,
                               help=help, **_value_kind(knob))
    group = p.add_argument_group("policy knobs, short", "--KNOB sets the knob of --policy")
    for name, owners in knob_flags().items():
        knob = owners[0][1]
        if any(k.type != knob.type for _, k in owners):
            raise ConfigError(f"policy knob {name!r} has different types in {', '.join(p for p, _ in owners)}")
        group.add_argument(f"--{knob.flag}", dest=name, default=None, **_value_kind(knob),
                           help="= " + ", ".join(f"--{policy}.{knob.flag}" for policy, _ in owners))


def _value_kind(knob: Knob) -> dict:
    """argparse's type, nargs and choices of a knob's flag."""
    if knob.value_type is bool:
        return dict(type=on_off, nargs="?", const=True, metavar="on|off")
    return dict(type=knob.value_type, choices=knob.choices, metavar=None if knob.choices else
                knob.value_type.__name__.upper())


def chosen_knobs(args: argparse.Namespace) -> dict:
    """The knobs of --policy from its section's flags and the short ones; a section flag of another
    policy, or one knob given both ways with two values, is a ConfigError naming the flags."""
    knobs = {name: getattr(args, name) for name in knob_flags() if getattr(args, name) is not None}
    for section in policy_sections():
        for knob in section.knobs:
            value, flag = getattr(args, f"{section.name}.{knob.name}"), f"--{section.name}.{knob.flag}"
            if value is None:
                continue
            if section.name != args.policy:
                raise ConfigError(f"{flag} is a knob of policy {section.name!r}, not of --policy {args.policy}")
            if not _same(knobs.setdefault(knob.name, value), value):
                raise ConfigError(f"{flag} {value} and --{knob.flag} {knobs[knob.name]} set one knob: pass one")
    return knobs


def _same(a, b) -> bool:
    """One knob value given two ways: equal, or both NaN (which the knob's own check then refuses)."""
    return a == b or (a != a and b != b)


def add_parser(sub, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="simulate RL steps on many GPUs from real length data",
                       description="Simulate synchronous RL steps (rollout, reward, training) with a "
                                   "rollpacker policy; writes {config, steps, total} as JSON.")
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    load_plugins()  # $ROLLPACKER_PLUGINS may register policies: choices and knob flags come from the registry
    p.add_argument("--workload", default="servegen-r1",
                   help=f"built-in ({', '.join(BUILTIN)}) or a JSONL path (plain or gzipped): "
                        f"{{\"prompt\": id, \"lengths\": [int, ...]}} a line")
    p.add_argument("--policy", default="tail", choices=list(POLICIES))
    add_knob_arguments(p)
    p.add_argument("--instances", type=int, default=16, help="rollout instances (GPUs = instances x --tp)")
    p.add_argument("--tp", type=int, default=1, help="tensor parallel size per instance")
    p.add_argument("--tp-mode", default="fixed", choices=TP_MODES,
                   help="fixed; plan (cost-model TP per round); online (RollPacker's preemption rule)")
    p.add_argument("--model", default="qwen2.5-7b", choices=list(MODELS))
    p.add_argument("--prompts", type=int, default=128, help="P: prompts per step")
    p.add_argument("--samples", type=int, default=8, help="R: responses per prompt")
    p.add_argument("--max-tokens", type=int, default=8192, help="L: most new tokens per response")
    p.add_argument("--steps", type=int, default=5, help="steps run (ignored with --epochs)")
    p.add_argument("--epochs", type=int, default=None,
                   help="run until every prompt of this many epochs of the dataset is trained exactly once and "
                        "none is pending (a fair window for every policy; capped, see sim/metrics.py)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--between", type=float, default=0.9, help="share of log-length variance between prompts")
    p.add_argument("--growth", type=float, default=0.0, help="relative growth of lengths per step")
    p.add_argument("--dataset-prompts", type=int, default=None, help="prompts in the dataset (default 16 x P)")
    p.add_argument("--scale-from", type=int, default=None, metavar="N",
                   help="built-in traces: N trace tokens map to --max-tokens (lengths scaled before the cap)")
    p.add_argument("--engine-profile", type=Path, default=None, metavar="FILE",
                   help="a fitted engine profile (JSON; benchmarks/sim_vs_real.py writes one): the instances are that engine "
                        "(with --tp 1) instead of --model's GPU cost model")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a constant, e.g. --set train.mfu=0.4 --set engine.mem_fraction=0.5")
    p.add_argument("--spec", action="store_true",
                   help="model speculative decoding in the tail (sim/speculation.py; = --set spec.enabled=true)")
    p.add_argument("--json", dest="json_out", type=Path, default=None, help="write the result here (default: stdout)")
    p.add_argument("--plot", type=Path, default=None, help="PNG: a step's timeline (running requests against capacity per instance, aborts, "
                   "token split); the step summary goes beside it as NAME-summary.png")
    p.add_argument("--plot-step", type=int, default=None, help="step drawn by --plot (default: the slowest)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (there is none without tqdm: rollpacker[sim])")


def constants_from(overrides: list[str]) -> SimConstants:
    constants = SimConstants()
    for item in overrides:
        key, sep, raw = item.partition("=")
        section, dot, name = key.partition(".")
        if not sep or not dot:
            raise ConfigError(f"--set {item!r}: expected SECTION.KEY=VALUE, e.g. --set train.mfu=0.4")
        part = getattr(constants, section, None)
        if section == "hardware" or not attrs.has(type(part)):
            sections = [f.name for f in attrs.fields(SimConstants) if f.name != "hardware"]
            raise ConfigError(f"--set {item!r}: unknown section {section!r}; sections: {', '.join(sections)}")
        fields = {f.name: f for f in attrs.fields(type(part))}
        if name not in fields:
            raise ConfigError(f"--set {item!r}: {section} has no {name!r}; keys: {', '.join(fields)}")
        value = _constant_value(item, getattr(part, name), raw)
        constants = attrs.evolve(constants, **{section: attrs.evolve(part, **{name: value})})  # checks its range
    return constants


def _constant_value(item: str, current, raw: str):
    """`raw` as a value of the type of the constant it replaces."""
    kind = type(current)
    try:
        return on_off(raw) if kind is bool else kind(raw)
    except (ValueError, argparse.ArgumentTypeError):
        raise ConfigError(f"--set {item!r}: {raw!r} is not a{'n' if kind is int else ''} {kind.__name__}"
                          + (" (on or off)" if kind is bool else "")) from None


def config_from(args: argparse.Namespace) -> SimConfig:
    knobs = chosen_knobs(args)
    valid = [k.name for k in knob_specs(args.policy)]
    for knob in knobs:
        if knob not in valid:
            raise ConfigError(f"{_flag(knob)} is not a knob of policy {args.policy!r} (its knobs: "
                              f"{', '.join(map(_flag, valid))})")
    if args.workload not in BUILTIN and not Path(args.workload).is_file():
        raise ConfigError(f"--workload {args.workload!r}: no such file, and not one of {', '.join(BUILTIN)}")
    for flag, path in (("--json", args.json_out), ("--plot", args.plot)):
        if path is not None and not path.parent.exists():
            raise ConfigError(f"{flag} {str(path)!r}: directory {str(path.parent)!r} does not exist")
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ConfigError("--plot needs matplotlib, which is not installed: pip install 'rollpacker[sim]'") from None
    config = SimConfig(workload=args.workload, policy=args.policy, knobs=knobs, prompts=args.prompts,
                       samples=args.samples, max_tokens=args.max_tokens, steps=args.steps, epochs=args.epochs, seed=args.seed,
                       instances=args.instances, tp=args.tp, tp_mode=args.tp_mode, model=args.model,
                       dataset_prompts=args.dataset_prompts, between=args.between, growth=args.growth,
                       scale_from=args.scale_from,
                       engine_profile=None if args.engine_profile is None else str(args.engine_profile))
    if args.plot_step is not None and args.epochs is None and not 0 <= args.plot_step < args.steps:
        raise ConfigError(f"--plot-step {args.plot_step} is outside 0..{args.steps - 1}")
    config.build_policy()  # knob values are checked here, before any work
    config.load_profile()
    return config


def _flag(knob: str) -> str:
    return "--" + knob.replace("_", "-")


def run(args: argparse.Namespace) -> int:
    config = config_from(args)
    constants = constants_from(args.overrides + (["spec.enabled=true"] if args.spec else []))
    sim = Simulation(config, constants, record_timeline=args.plot is not None)
    progress = None if args.no_progress else _progress_bar(config)
    try:
        result = sim.run(progress)
    finally:
        if progress is not None:
            progress.close()
    result["constants"] = attrs.asdict(constants)
    text = json.dumps(result, indent=1)
    if args.json_out is None:
        print(text)
    else:
        args.json_out.write_text(text + "\n")
    if args.plot is not None:
        from .plot import plot_run
        if args.plot_step is not None and args.plot_step >= len(result["steps"]):  # (--epochs: known only now)
            raise ConfigError(f"--plot-step {args.plot_step} is outside 0..{len(result['steps']) - 1}, the run's "
                              f"steps (the JSON is written)")
        step = args.plot_step if args.plot_step is not None else max(
            range(len(result["steps"])), key=lambda i: result["steps"][i]["rollout_s"])
        plot_run(result, sim.timelines, step, args.plot)
    t = result["total"]
    print(f"{config.policy}: {t['steps']} steps, rollout {t['mean_rollout_s']:.1f} s/step "
          f"({t['rollout_over_floor']:.2f}x the floor), bubble {t['bubble_ratio']:.1%}, "
          f"lost {t['lost_prompts']}, duplicate {t['duplicate_prompts']}, pending {t['pending_prompts']}"
          + (f"; epoch {t['epoch_s']:.0f} s, {t['step_s_per_batch']:.1f} s a step per P trained" if config.epochs else ""),
          file=sys.stderr)
    return 0


def _progress_bar(config: SimConfig):
    """A tqdm bar over the steps; None without tqdm (a core install: the bar comes with rollpacker[sim])."""
    try:
        from tqdm import tqdm
    except ModuleNotFoundError:
        return None
    return tqdm(total=None if config.epochs else config.steps, desc=f"simulate {config.policy}", unit="step", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rollpacker.sim", description=add_parser.__doc__)
    try:
        add_arguments(parser)
        args = parser.parse_args(argv)
        return run(args)
    except ConfigError as exc:
        print(f"rollpacker simulate: error: {exc}", file=sys.stderr)
        return 2
