"""Plugin modules at the edges: one that raises on import, and a resume without the plugin that
registered the run's policy, are one line each naming the module or the variable to set (both CLIs,
`--help` included)."""

from __future__ import annotations

import json

import pytest

from plugin_helpers import TRAIN, plugin_env, run, simulate

BROKEN = {
    "raises": ("import json\n\ndef setup():\n    raise RuntimeError('no licence server')\n\nsetup()\n",
               "raised on import: RuntimeError: no licence server ({file} line 4)"),
    "syntax": ("def f(:\n    pass\n", "raised on import: SyntaxError: invalid syntax (broken.py, line 1)"),
    "missing dependency": ("import no_such_dependency_xyz\n", "does not import (No module named 'no_such_dependency_xyz')"),
}


@pytest.mark.parametrize("case", list(BROKEN))
@pytest.mark.parametrize("cli", ["train", "simulate"])
def test_a_plugin_that_raises_on_import_is_one_line_naming_it_even_for_help(tmp_path, cli, case):
    """The issue's case: a module that raises while it imports was a 14-28-line traceback in both CLIs."""
    source, expected = BROKEN[case]
    (tmp_path / "broken.py").write_text(source)
    args = [TRAIN, "--help"] if cli == "train" else simulate("--help")
    proc = run(args, plugin_env(tmp_path, "broken"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    (line,) = proc.stderr.strip().splitlines()
    assert "ROLLPACKER_PLUGINS: plugin module 'broken' " + expected.format(file=tmp_path / "broken.py") in line


@pytest.fixture(scope="module")
def tiny_model():
    from rollpacker.backends.models import tiny_random_llama

    return tiny_random_llama()


@pytest.mark.timeout(300)
def test_a_resume_without_the_plugin_of_its_policy_names_the_variable_and_the_module(tmp_path, tiny_model):
    """The issue's case: resuming a run whose policy came from a plugin, without ROLLPACKER_PLUGINS,
    was an AttributeError.  The run saves its plugin modules; the resume names them, before any model
    loads, and resumes with them set."""
    out = tmp_path / "run"
    first = run([TRAIN, "--preset", "tiny_debug", "--model", tiny_model, "--trainer", "torch", "--steps", 1,
                 "--out", out, "--policy", "foo"], plugin_env(tmp_path, "my_plugin"), timeout=240)
    assert first.returncode == 0, first.stderr[-3000:]
    assert json.loads((out / "state" / "config.json").read_text())["plugins"] == ["my_plugin"]
    bare = run([TRAIN, "--resume", out, "--steps", 2], plugin_env(tmp_path, None))
    assert bare.returncode == 2 and "Traceback" not in bare.stderr, bare.stderr[-2000:]
    assert bare.stderr.strip() == (f"error: --resume {out}: the run's --policy 'foo' is not registered here (it came "
                                   f"from a plugin module): set ROLLPACKER_PLUGINS=my_plugin and run again")
    again = run([TRAIN, "--resume", out, "--steps", 2], plugin_env(tmp_path, "my_plugin"), timeout=240)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [0, 1]


def test_a_saved_config_without_its_plugin_modules_names_the_variable(tmp_path):
    """A run saved before the config kept its plugin modules: the line names the variable to set."""
    state = tmp_path / "run" / "state"
    state.mkdir(parents=True)
    (state / "config.json").write_text(json.dumps({"policy": "sync", "rollout": "embedded", "trainer": "counting"}))
    (state / "scheduler.json").write_text("{}")
    proc = run([TRAIN, "--resume", tmp_path / "run"], plugin_env(tmp_path, None))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip() == (f"error: --resume {tmp_path / 'run'}: the run's --trainer 'counting' is not "
                                   f"registered here (it came from a plugin module): set ROLLPACKER_PLUGINS to the "
                                   f"module that registers it and run again")
