"""Registries: a policy, a rollout engine and a trainer added from a plugin module (one file, one
register call each, nothing in the package edited) are choices of both CLIs, with their options as
flags, and a run really uses them; bad component options are one line naming the flag."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import typing
from pathlib import Path

import attrs
import pytest

from plugin_helpers import ROOT, TRAIN, run, simulate
from plugin_helpers import plugin_env as with_plugins
from rollpacker.core.errors import ConfigError
from rollpacker.core.policies.knobs import source_docstrings
from rollpacker.train import config as run_config
from rollpacker.train.config import RunConfig, parse
from rollpacker.backends.trainer.pytorch import TorchTrainerConfig
from rollpacker.train.algorithm import BatchingOptions, LossOptions, SamplingOptions
from rollpacker.train.registry import ROLLOUTS, TRAINERS, BuildContext
from rollpacker.train.replay import ReplayOptions
from rollpacker.train.rewards import RewardsConfig
from rollpacker.train.session import loop_config
from rollpacker.train.trainers import common_options




@pytest.fixture
def plugin_env(tmp_path) -> dict:
    return with_plugins(tmp_path, "my_plugin")


@pytest.fixture(scope="module")
def tiny_model():
    from rollpacker.backends.models import tiny_random_llama

    return tiny_random_llama()


@pytest.mark.timeout(300)
def test_a_plugin_policy_engine_and_trainer_run_in_reference_train(plugin_env, tiny_model, tmp_path):
    """The issue's bug: a policy put in the registry crashed reference/train.py --policy foo (RunConfig
    had no section for it).  Now it, an engine and a trainer from the plugin run one step."""
    out = tmp_path / "run"
    proc = run([TRAIN, "--preset", "tiny_debug", "--model", tiny_model, "--steps", 1, "--out", out,
                "--policy", "foo", "--foo.foo-knob", 7, "--rollout", "counting", "--counting.label", "hello",
                "--trainer", "loud", "--loud.tag", "xyz"], plugin_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "policy foo on cpu" in proc.stdout
    assert "foo opens a round, foo_knob=7" in proc.stderr
    assert "counting engine hello: 4 requests" in proc.stdout  # tiny_debug: P=2 x R=2, one sync-like round
    assert "loud trainer xyz: optimizer step" in proc.stdout
    state = json.loads((out / "state" / "trainer" / "rollpacker_trainer.json").read_text())
    assert state["trainer"] == "LoudTrainer" and state["step"] == 1
    saved = json.loads((out / "state" / "config.json").read_text())
    assert (saved["policy"], saved["foo"]["foo_knob"], saved["rollout"], saved["counting"], saved["trainer"],
            saved["loud"]) == ("foo", 7, "counting", {"label": "hello"}, "loud", {"tag": "xyz"})


def test_a_policy_put_in_the_registry_dict_is_a_policy_of_the_trainer(tmp_path):
    """The issue's report as it was: POLICIES["foo"] = ... before the CLI is imported; parse and
    validate of --policy foo raised AttributeError ('RunConfig' object has no attribute 'foo')."""
    (tmp_path / "put_foo.py").write_text("from attrs import frozen\n"
                                         "from rollpacker.core.policies import POLICIES, SyncPolicy\n"
                                         "@frozen(kw_only=True)\nclass Foo(SyncPolicy):\n    bar: int = 1\n"
                                         "POLICIES['foo'] = Foo\n")
    check = ("import put_foo\nfrom rollpacker.train.config import parse\n"
             "config = parse(['--preset', 'tiny_debug', '--device', 'cpu', '--policy', 'foo', '--foo.bar', '4'])\n"
             "config.validate()\nprint(type(config.build_policy()).__name__, config.build_policy().bar)\n")
    proc = run(["-c", check], {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["Foo", "4"]


def test_the_plugin_options_are_in_the_help_of_both_clis(plugin_env):
    train = run([TRAIN, "--help"], {**plugin_env, "COLUMNS": "200"}, timeout=120)
    text = " ".join(train.stdout.replace("│", "").split())
    assert train.returncode == 0, train.stderr
    for part in ("{sync,tail,sorted,partial,foo}", "{embedded,sglang,counting}", "{titan,torch,loud}",
                 "--foo.foo-knob INT A knob only the plugin has.", "--counting.label STR Printed beside the count",
                 "--loud.tag STR Printed at each optimizer step.", "Knobs of --rollout counting (The embedded engine, counted)."):
        assert part in text, part
    sim = run(simulate("--help"), {**plugin_env, "COLUMNS": "200"}, timeout=120)
    assert sim.returncode == 0 and "partial,foo}" in sim.stdout and "--foo-knob" in sim.stdout
    assert "A knob only the plugin has." in sim.stdout


def test_a_plugin_policy_runs_in_the_simulator(plugin_env, tmp_path):
    out = tmp_path / "sim.json"
    proc = run(simulate("--policy", "foo", "--foo-knob", "5", "--prompts", "4", "--samples", "2", "--steps", "2",
                        "--max-tokens", "512", "--instances", "2", "--no-progress", "--json", str(out)),
               plugin_env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["config"]["policy"] == "foo" and result["config"]["knobs"] == {"foo_knob": 5}
    assert proc.stderr.count("foo opens a round, foo_knob=5") == 2 and len(result["steps"]) == 2


@pytest.mark.parametrize("cli", ["train", "simulate"])
def test_a_plugin_that_does_not_import_is_one_line_naming_the_variable(plugin_env, cli):
    env = {**plugin_env, "ROLLPACKER_PLUGINS": "my_plugin,no_such_plugin"}
    proc = run([TRAIN, "--help"] if cli == "train" else simulate("--help"), env, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "ROLLPACKER_PLUGINS" in line and "'no_such_plugin'" in line


def test_bad_plugin_options_and_registrations_are_one_line(plugin_env, tiny_model, tmp_path):
    proc = run([TRAIN, "--preset", "tiny_debug", "--model", tiny_model, "--out", tmp_path / "run",
                "--rollout", "counting", "--counting.label", ""], plugin_env, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip() == "error: --counting.label must not be empty"
    (tmp_path / "clash.py").write_text("from rollpacker.core.policies import SyncPolicy, register_policy\n"
                                       "register_policy('steps', SyncPolicy)\n")
    proc = run([TRAIN, "--help"], {**plugin_env, "ROLLPACKER_PLUGINS": "clash"}, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "'steps'" in proc.stderr and "--steps" in proc.stderr
    from rollpacker.core.policies import SyncPolicy, register_policy

    with pytest.raises(ConfigError, match="'tail' must be a new"):
        register_policy("tail", SyncPolicy)
    with pytest.raises(ConfigError, match="must be an attrs class"):
        register_policy("bare", dict)


@pytest.mark.parametrize(
    "args,line",
    [
        (["--engine-capacity", "0"], "--engine-capacity must be >= 1, got 0"),
        (["--spec-tokens", "0"], "--spec-max-rows must be >= 0 and --spec-tokens >= 1, got None and 0"),
        (["--reward-workers", "0"], "--reward-workers must be >= 1, got 0"),
        (["--reward-deadline-s", "nan"], "--reward-deadline-s must be > 0, got nan"),
        (["--reward-hedge-after-s", "-1"], "--reward-hedge-after-s must be >= 0, got -1"),
        (["--reward-burst-workers", "-1"], "--reward-burst-workers must be >= 0, got -1"),
        (["--rollout", "sglang"], "--rollout sglang needs --sglang-urls URL [URL ...]"),
        (["--rollout", "sglang", "--sglang-urls", "http://127.0.0.1:1", "--weight-sync-bucket-mb", "0"],
         "--weight-sync-bucket-mb must be >= 1, got 0"),
        (["--rollout", "sglang", "--sglang-urls", "http://127.0.0.1:1", "--weight-sync", "ftp"],
         "--weight-sync must be nccl or disk:DIR (a directory every server can read), got 'ftp'"),
        (["--weight-sync", "nccl"], "--weight-sync nccl is for --rollout sglang"),
        (["--trainer", "torch", "--tp", "2", "--nproc", "2"], "--trainer torch shards over all --nproc ranks"),
    ],
)
def test_a_bad_component_option_is_one_config_error_naming_its_flag(args, line):
    config = parse(["--preset", "tiny_debug", "--device", "cpu", *args])
    with pytest.raises(ConfigError) as info:
        config.validate()
    assert str(info.value).startswith(line) and "\n" not in str(info.value)


def test_the_component_configs_take_the_flags():
    config = parse(["--rollout", "sglang", "--sglang-urls", "http://127.0.0.1:1", "--weight-sync", "disk:/tmp/w",
                    "--reward-workers", "3", "--reward-deadline-s", "1.5", "--trainer", "titan", "--tp", "2"])
    rollout = config.rollout_options()
    assert type(rollout).__name__ == "SGLangRollout" and rollout.sglang_urls == ("http://127.0.0.1:1",)
    assert rollout.weights_dir == "/tmp/w"
    rewards = config.rewards_options()
    assert (rewards.reward, rewards.reward_workers, rewards.reward_deadline_s) == ("reasoning-gym", 3, 1.5)
    assert rewards.scheduler_config().t_max == 1.5 and rewards.scheduler_config().t_min == 1.5
    assert parse(["--micro-batch-tokens", "77", "--advantage", "rloo"]).batcher_config().token_budget == 77


def test_the_colocation_flags_reach_the_live_loop():
    """--colocate and --train-after-round: what the live driver's LoopConfig is built with."""
    modes = {flag: loop_config(parse([flag])) for flag in ("--colocate", "--train-after-round")}
    assert (modes["--colocate"].colocate, modes["--colocate"].train_after_round) == (True, False)
    assert (modes["--train-after-round"].colocate, modes["--train-after-round"].train_after_round) == (False, True)
    assert not loop_config(parse([])).train_after_round


def normalized(text: str) -> str:
    return " ".join(text.replace("│", " ").split())


PRODUCTS = {
    SamplingOptions: lambda run: attrs.asdict(loop_config(run)),
    BatchingOptions: lambda run: attrs.asdict(run.batcher_config()),
    LossOptions: lambda run: attrs.asdict(TorchTrainerConfig(**common_options(
        BuildContext(run=run, model_dir=Path("m"), device="cpu")))),
}
"""Each algorithm component -> what its consumer is built with, from the run's flags (the live loop's
settings, the core's batcher config, the trainer's config)."""
ALGORITHM_FLAGS = [(component, f) for component in PRODUCTS for f in attrs.fields(component)]


def other_flag_value(component, option) -> list[str]:
    """The flag setting `option` (an attrs field of `component`) to a valid value that is not its default."""
    flag = "--" + option.name.replace("_", "-")
    choices = typing.get_args(typing.get_type_hints(component)[option.name])
    if choices and all(isinstance(c, str) for c in choices):
        return [flag, next(c for c in choices if c != option.default)]
    if option.default is False:
        return [flag]
    if option.default is None and int in choices:  # unset: picked later (--micro-batch-tokens: the memory plan)
        return [flag, "7"]
    return [flag, "0.5" if option.default in (None, 1.0) else str(option.default + 1)]


@pytest.mark.parametrize("component,option", ALGORITHM_FLAGS, ids=[f.name for _, f in ALGORITHM_FLAGS])
def test_every_algorithm_flag_reaches_what_its_component_builds(component, option):
    """--temperature, --advantage, --kl-coef, ...: a flag set to another value changes the loop's,
    the batcher's or the trainer's config (a flag dropped on the way fails here)."""
    argv = other_flag_value(component, option)
    changed, default = parse(argv), parse([])
    assert getattr(changed.options(component), option.name) != option.default
    assert PRODUCTS[component](changed) != PRODUCTS[component](default), f"{argv} does not reach {component.__name__}'s consumer"


def test_each_built_in_option_is_declared_once_in_its_component(capsys):
    """The built-in engines', trainers' and rewards' options are top-level flags (--engine-capacity),
    declared by their component class only: RunConfig's field has the class's default and help, and
    the run's own flags (the class written in config.py) do not name it again."""
    assert set(run_config.FLAT) == {*ROLLOUTS.values(), *TRAINERS.values(), RewardsConfig, SamplingOptions,
                                    BatchingOptions, LossOptions, ReplayOptions}
    run_fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    hand_written = RunConfig.__mro__[1].__annotations__
    with pytest.raises(SystemExit):
        parse(["--help"])
    shown = normalized(capsys.readouterr().out)
    options = [(component, f) for component in run_config.FLAT for f in attrs.fields(component)]
    assert len(options) >= 12
    for component, option in options:
        doc = source_docstrings(component)[option.name]
        assert option.name not in hand_written, option.name
        field = run_fields[option.name]
        assert field.default == option.default
        assert [m.documentation for m in typing.get_args(field.type)[1:]] == [doc]
        assert normalized(doc) in shown, option.name


def test_an_option_declared_by_the_run_and_a_component_is_refused():
    class Run:
        steps: int = 1
        engine_capacity: int = 8
        """Declared again."""

    with pytest.raises(ConfigError, match="^--engine-capacity is declared twice"):
        run_config.assemble(Run)


def test_both_clis_list_every_registered_policy_s_knobs_with_the_same_help(plugin_env):
    """For each policy, the plugin's too: the same --NAME.KNOB flags under the same title in
    reference/train.py --help and rollpacker simulate --help, each with the same help and default."""
    helps = {"train": run([TRAIN, "--help"], {**plugin_env, "COLUMNS": "100"}, timeout=120),  # wider: columns
             "simulate": run(simulate("--help"), {**plugin_env, "COLUMNS": "4000"}, timeout=120)}  # no wrapping
    assert all(proc.returncode == 0 for proc in helps.values()), [p.stderr for p in helps.values()]
    texts = {cli: normalized(proc.stdout) for cli, proc in helps.items()}
    check = ("import my_plugin, json; from rollpacker.core.policies import policy_sections\n"
             "print(json.dumps([[s.name, s.title, [[k.flag, k.paragraph, str(k.default)] for k in s.knobs]] "
             "for s in policy_sections()]))")
    sections = json.loads(run(["-c", check], plugin_env, timeout=120).stdout)
    assert [s[0] for s in sections] == ["sync", "tail", "sorted", "partial", "foo"]
    for name, title, knobs in sections:
        for cli, text in texts.items():
            assert title in text, (cli, title)
            listed = set(re.findall(rf"--{name}\.(?!no-)([a-z][a-z-]*)", text))
            assert listed == {flag for flag, _, _ in knobs}, (cli, name)
            for flag, paragraph, default in knobs:
                entry = rf"--{name}\.{flag}(?:,? \S+)? " + re.escape(f"{paragraph} (default: {default})")
                assert re.search(entry, text), (cli, name, flag)
