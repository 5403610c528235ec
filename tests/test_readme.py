"""The README's loop example runs, and does what its text says."""

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_loop_example_runs_short_and_long_rounds(tmp_path):
    text = README.read_text()
    block = re.search(r"<!-- example: loop -->\n```python\n(.*?)```", text, re.S).group(1)
    script = tmp_path / "example.py"
    script.write_text(block)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True)
    rounds = eval(out.stdout.strip().splitlines()[-1])  # noqa: S307 - our own README's output
    kinds = [kind for kind, _ in rounds]
    assert len(rounds) == 10 and "long" in kinds and kinds.count("short") >= 3 * kinds.count("long")


def test_readme_shows_make_train_and_make_test_first():
    commands = re.findall(r"^make (\w+)", README.read_text(), re.M)
    assert commands[:2] == ["train", "test"]


def example(name: str) -> str:
    """The code block under `<!-- example: NAME -->` in the README."""
    return re.search(rf"<!-- example: {re.escape(name)} -->\n```\w+\n(.*?)```", README.read_text(), re.S).group(1)


def test_readme_train_on_your_data_runs_both_layouts_and_the_custom_reward(tmp_path):
    """The "Train on your data" commands, as written, on the tiny model for 2 steps (tiny_debug)."""
    import json

    from rollpacker.backends.models import tiny_random_llama

    root = README.parent
    (tmp_path / "my_reward.py").write_text(example("my_reward.py"))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "qa.jsonl").write_text(example("data/qa.jsonl"))
    tiny = ["--preset", "tiny_debug", "--model", str(tiny_random_llama()), "--trainer", "torch"]
    commands = example("data").replace("\\\n", " ").splitlines()
    for line in (c.split("#")[0].split() for c in commands if c.strip()):
        assert line[0] == ".venv/bin/python", line  # the Makefile's environment: rollpacker is there
        script = str(root / line[1])
        args = line[2:] + (tiny if line[1] == "reference/train.py" else [])
        proc = subprocess.run([sys.executable, script, *args], cwd=tmp_path, capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stderr[-3000:]
    for run in ("math", "qa"):
        records = [json.loads(r) for r in (tmp_path / "runs" / run / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records] == [0, 1] and all(r["reward_num_failed"] == 0 for r in records)
    assert all("reward_metric_answered" in r for r in records), "the dict's other keys are metrics"
