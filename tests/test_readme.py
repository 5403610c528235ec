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
