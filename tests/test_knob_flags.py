"""Policy knobs on the command line: both CLIs (`rollpacker simulate`, reference/train.py) read them
from the core's policy classes, so every core knob is a flag of each and none is copied."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rollpacker.core import POLICIES, ConfigError, knob_specs
from rollpacker.sim.cli import add_arguments, config_from
from rollpacker.train.config import RunConfig, parse

ROOT = Path(__file__).resolve().parents[1]
KNOBS = [(policy, knob) for policy in POLICIES for knob in knob_specs(policy)]


def other_value(knob):
    """A valid value of `knob` that is not its default (P is 4 below)."""
    if knob.choices:
        return next(c for c in knob.choices if c != knob.default)
    if knob.value_type is bool:
        return not knob.default
    if knob.default is None:
        return {int: 9, float: 0.5}[knob.value_type]
    return knob.default + {int: 1, float: 0.25}[knob.value_type]


def simulate_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--prompts", "4", "--samples", "2", *argv])


def train_flag(policy: str, name: str, value) -> list[str]:
    flag = f"--{policy}.{name.replace('_', '-')}"
    if isinstance(value, bool):
        return [flag if value else f"--{policy}.no-{name.replace('_', '-')}"]
    return [flag, str(value)]


def normalized(text: str) -> str:
    """Help text without its wrapping and box drawing, to look a docstring up in it."""
    return "".join(text.replace("│", "").split())


@pytest.mark.parametrize("policy,knob", KNOBS, ids=[f"{p}.{k.name}" for p, k in KNOBS])
def test_every_core_knob_is_settable_from_both_clis(policy, knob):
    value = other_value(knob)
    raw = ("on" if value else "off") if isinstance(value, bool) else str(value)
    simulated = config_from(simulate_args("--policy", policy, "--" + knob.name.replace("_", "-"), raw))
    assert getattr(simulated.build_policy(), knob.name) == value
    simulated = config_from(simulate_args("--policy", policy, f"--{policy}.{knob.flag}", raw))  # the trainer's spelling
    assert getattr(simulated.build_policy(), knob.name) == value
    trained = parse(["--policy", policy, "--prompts", "4", "--samples", "2", *train_flag(policy, knob.name, value)])
    assert getattr(trained.build_policy(), knob.name) == value
    assert knob.help, f"{policy}.{knob.name} has no docstring: it is the flags' help text"


def test_every_policy_has_a_knob_section_in_the_trainer():
    assert set(POLICIES) <= {f.name for f in dataclasses.fields(RunConfig)}


def test_the_help_of_both_clis_is_the_core_docstring(capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    sim_help = normalized(parser.format_help())
    with pytest.raises(SystemExit):
        parse(["--help"])
    train_help = normalized(capsys.readouterr().out)
    for _, knob in KNOBS:
        assert normalized(knob.help) in sim_help and normalized(knob.help) in train_help, knob.name


def test_a_knob_added_in_the_core_is_a_flag_of_both_clis(tmp_path):
    """The CLIs keep no list of knobs: a field added to a core policy class (here by a subclass put in
    the registry before the CLIs are imported) is a flag of each, with its docstring as help."""
    (tmp_path / "extra_knob.py").write_text(textwrap.dedent('''
        from attrs import frozen
        from rollpacker.core.policies import POLICIES, SortedPolicy

        @frozen(kw_only=True)
        class SortedPlus(SortedPolicy):
            spare_knob: int = 3
            """A knob that only this test adds."""

        POLICIES["sorted"] = SortedPlus
    '''))
    check = textwrap.dedent('''
        import argparse, contextlib, io
        import extra_knob
        from rollpacker.sim.cli import add_arguments, config_from
        from rollpacker.train.config import parse

        parser = argparse.ArgumentParser()
        add_arguments(parser)
        sim = config_from(parser.parse_args(["--policy", "sorted", "--spare-knob", "7"])).build_policy()
        train = parse(["--policy", "sorted", "--sorted.spare-knob", "8"]).build_policy()
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            parse(["--help"])
        print(sim.spare_knob, train.spare_knob, "only this test adds" in parser.format_help(),
              "only this test adds" in " ".join(out.getvalue().replace("│", "").split()))
    ''')
    proc = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin", "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["7", "8", "True", "True"]


def test_a_saved_config_from_before_a_knob_existed_still_resumes(tmp_path):
    """state/config.json of an older run lacks knobs added since (and the sync section): the resumed
    config takes the core's defaults for them and keeps the saved values."""
    spec = importlib.util.spec_from_file_location("reference_train", ROOT / "reference" / "train.py")
    reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reference)
    saved = json.loads(json.dumps(dataclasses.asdict(RunConfig()), default=str))
    del saved["sync"]
    saved["tail"] = {"eta_prompts": 1.5, "eta_responses": 1.0, "predict": False, "long_round_at": None}
    saved["sorted"] = {"group_batches": 2, "mode": "partial", "staleness": 1, "capacity": None}
    state = tmp_path / "run" / "state"
    state.mkdir(parents=True)
    (state / "config.json").write_text(json.dumps(saved))
    (state / "scheduler.json").write_text("{}")
    config = reference.resumed_config(parse(["--resume", str(tmp_path / "run")]), ["--resume", str(tmp_path / "run")])
    tail = config.build_policy("tail")
    assert (tail.eta_prompts, tail.eta_responses, tail.defer_at) == (1.5, 1.0, None)
    sorted_rl = config.build_policy("sorted")
    assert (sorted_rl.group_batches, sorted_rl.mode, sorted_rl.prefetch) == (2, "partial", True)


@pytest.mark.parametrize(
    "argv,line",
    [
        (["--policy", "tail", "--sorted.staleness", "2"], "--sorted.staleness is a knob of policy 'sorted', not of --policy tail"),
        (["--policy", "tail", "--eta-prompts", "1.5", "--tail.eta-prompts", "2"],
         "--tail.eta-prompts 2.0 and --eta-prompts 1.5 set one knob: pass one"),
    ],
)
def test_a_simulator_knob_flag_that_would_be_ignored_is_one_error(argv, line):
    """--NAME.KNOB of a policy that does not run, or a knob set twice with two values, is refused, not dropped."""
    with pytest.raises(ConfigError) as info:
        config_from(simulate_args(*argv))
    assert str(info.value) == line


def test_a_knob_given_both_ways_with_one_value_is_that_value():
    config = config_from(simulate_args("--policy", "tail", "--eta-prompts", "1.5", "--tail.eta-prompts", "1.5"))
    assert config.knobs == {"eta_prompts": 1.5}
