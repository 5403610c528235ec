"""Every numeric knob and constant of `rollpacker simulate` checks its own range where it is declared:
NaN, an infinity and a value below every range (-2) are refused with one line naming the flag, the
`--set` key or the field; before, inf/nan crashed (OverflowError, ZeroDivisionError) or ran to a
JSON full of NaN.  Read from the classes, so a field added later is covered by these tests."""

from __future__ import annotations

import argparse
import typing

import attrs
import pytest

from rollpacker.core.cost_model import Hardware, ModelShape
from rollpacker.core.errors import ConfigError
from rollpacker.core.policies import POLICIES, policy_sections
from rollpacker.sim.cli import add_arguments, main
from rollpacker.sim.config import SimConfig
from rollpacker.sim.constants import H100, MODELS, SimConstants

FLOAT_BAD = ("nan", "inf", "-inf", "-2")
INT_BAD = ("-2",)
TINY = ["--prompts", "4", "--samples", "2", "--steps", "1", "--instances", "1", "--max-tokens", "256", "--no-progress"]


def numeric_fields(cls) -> list[tuple[str, type]]:
    """(name, int or float) of every field of attrs class `cls` that holds a number (optional or not)."""
    hints = typing.get_type_hints(cls)
    found = []
    for f in attrs.fields(cls):
        kinds = {t for t in typing.get_args(hints[f.name]) or (hints[f.name],) if t is not type(None)}
        if kinds in ({int}, {float}):
            found.append((f.name, kinds.pop()))
    return found


def bad_values(kind: type) -> tuple[str, ...]:
    return FLOAT_BAD if kind is float else INT_BAD


def one_error_line(argv, capsys) -> str:
    """`rollpacker simulate ARGV` refuses: exit 2, one line on stderr, nothing on stdout; the line."""
    assert main([*TINY, *argv]) == 2, argv
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, (argv, err)
    return err.strip()


def sim_flags() -> set[str]:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return {s for action in parser._actions for s in action.option_strings}


KNOBS = [(section.name, knob.flag, knob.value_type) for section in policy_sections() for knob in section.knobs
         if knob.value_type in (int, float)]
SECTIONS = [f.name for f in attrs.fields(SimConstants) if f.name != "hardware"]
CONSTANTS = [(section, name, kind) for section in SECTIONS
             for name, kind in numeric_fields(type(getattr(SimConstants(), section)))]
CONFIG_FIELDS = numeric_fields(SimConfig)


def test_the_tables_cover_every_class():
    """The lists below are read from the classes: every policy, every section of constants, SimConfig."""
    assert {policy for policy, _, _ in KNOBS} >= {"tail", "sorted", "partial"}
    assert {section for section, _, _ in CONSTANTS} == {"engine", "reward", "train", "spec"}
    assert {"mfu", "mem_fraction", "hang_rate", "draft_tokens"} <= {name for _, name, _ in CONSTANTS}
    assert {"growth", "between", "seed", "dataset_prompts", "bubble_capacity"} <= {n for n, _ in CONFIG_FIELDS}


@pytest.mark.parametrize("policy,flag,kind", KNOBS, ids=[f"{p}.{f}" for p, f, _ in KNOBS])
def test_every_numeric_policy_knob_refuses_nan_inf_and_out_of_range(policy, flag, kind, capsys):
    name = flag.replace("-", "_")
    for value in bad_values(kind):
        for spelling in (f"--{policy}.{flag}={value}", f"--{flag}={value}"):
            line = one_error_line(["--policy", policy, spelling], capsys)
            assert line.startswith(f"rollpacker simulate: error: {name} must be ") and line.endswith(
                f", got {kind(value)!r}"), line


@pytest.mark.parametrize("policy,flag,kind", KNOBS, ids=[f"{p}.{f}" for p, f, _ in KNOBS])
def test_the_trainer_refuses_the_same_knob_values(policy, flag, kind):
    """The policy classes check their knobs, so reference/train.py's --POLICY.KNOB flags refuse them too."""
    from rollpacker.train.config import parse

    name = flag.replace("-", "_")
    for value in bad_values(kind):
        config = parse(["--preset", "tiny_debug", "--device", "cpu", "--policy", policy, f"--{policy}.{flag}={value}"])
        with pytest.raises(ConfigError, match=f"^{name} must be .*, got {kind(value)!r}$"):
            config.validate()


@pytest.mark.parametrize("name,kind", CONFIG_FIELDS, ids=[n for n, _ in CONFIG_FIELDS])
def test_every_numeric_run_setting_refuses_nan_inf_and_out_of_range(name, kind, capsys):
    flag = "--" + name.replace("_", "-")
    for value in bad_values(kind):
        if flag in sim_flags():
            line = one_error_line([f"{flag}={value}"], capsys)
            assert line.startswith(f"rollpacker simulate: error: {flag} must be "), line
        else:  # no flag: the field itself refuses it
            with pytest.raises(ConfigError, match=f"^{flag} must be "):
                SimConfig(**{name: kind(value)})


@pytest.mark.parametrize("section,name,kind", CONSTANTS, ids=[f"{s}.{n}" for s, n, _ in CONSTANTS])
def test_every_numeric_constant_refuses_nan_inf_and_out_of_range(section, name, kind, capsys):
    for value in bad_values(kind):
        line = one_error_line(["--set", f"{section}.{name}={value}"], capsys)
        assert line.startswith(f"rollpacker simulate: error: {section}.{name} must be "), line


@pytest.mark.parametrize("shape", [H100, *MODELS.values()], ids=lambda shape: shape.name)
def test_the_hardware_and_model_shapes_refuse_nan_inf_and_out_of_range(shape):
    """Not settable from the command line, checked alike for a user who builds their own."""
    for name, kind in numeric_fields(type(shape)):
        for value in bad_values(kind):
            with pytest.raises(ConfigError, match=f"^{name} must be "):
                attrs.evolve(shape, **{name: kind(value)})


@pytest.mark.parametrize("argv,line", [
    (["--eta-prompts", "inf"], "eta_prompts must be a finite number >= 1, got inf"),  # was an OverflowError
    (["--growth", "inf"], "--growth must be a finite number > -1, got inf"),  # was an OverflowError
    (["--growth", "nan"], "--growth must be a finite number > -1, got nan"),  # was a ValueError
    (["--set", "train.mfu=0"], "train.mfu must be a number in (0, 1], got 0.0"),  # was a ZeroDivisionError
    (["--set", "train.mfu=-1"], "train.mfu must be a number in (0, 1], got -1.0"),  # was a ValueError
    (["--set", "train.mfu=nan"], "train.mfu must be a number in (0, 1], got nan"),  # ran to a JSON of NaN
    (["--tail.eta-prompts", "nan"], "eta_prompts must be a finite number >= 1, got nan"),  # was "two flags given"
    (["--set", "engine.mem_fraction=2"], "engine.mem_fraction must be a number in (0, 1], got 2.0"),  # ran
    (["--set", "spec.enabled=maybe"], "--set 'spec.enabled=maybe': 'maybe' is not a bool (on or off)"),  # was False
    (["--seed", "-1"], "--seed must be an integer >= 0, got -1"),  # was numpy's ValueError
])
def test_the_reported_cases_are_one_line(argv, line, capsys):
    assert one_error_line(argv, capsys) == f"rollpacker simulate: error: {line}"


def test_a_knob_given_both_ways_with_one_value_is_accepted_and_two_values_refused(capsys):
    assert main([*TINY, "--tail.eta-prompts", "1.5", "--eta-prompts", "1.5", "--json", "/dev/null"]) == 0
    capsys.readouterr()
    assert one_error_line(["--tail.eta-prompts", "1.5", "--eta-prompts", "2"], capsys) == (
        "rollpacker simulate: error: --tail.eta-prompts 1.5 and --eta-prompts 2.0 set one knob: pass one")
    assert sorted(POLICIES) == sorted({s.name for s in policy_sections()})
