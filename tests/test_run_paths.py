"""Where runs go and the paths they keep (rollpacker/train/run_paths.py), through the real trainer:
the README's `make train` runs again (each run its own runs/<date-time>, runs/latest the newest),
and a run started with relative --dataset / --reward paths resumes from another directory, the same
file named another way being the same file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rollpacker.train.run_paths import followed, link_latest, new_run_path
from test_reference_train import TRAIN, records, tiny_model  # noqa: F401 - fixture

QA = "\n".join(json.dumps({"question": f"What is {i} + {i}?", "answer": str(2 * i)}) for i in range(6)) + "\n"
REWARD = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.5\n"


def train(cwd: Path, *args) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(TRAIN), *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.timeout(600)
def test_runs_without_out_each_get_a_directory_and_latest_resumes_the_newest_from_elsewhere(tiny_model, tmp_path):
    home, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    (home / "data").mkdir(parents=True)
    elsewhere.mkdir()
    (home / "data" / "qa.jsonl").write_text(QA)
    (home / "my_reward.py").write_text(REWARD)
    flags = ["--preset", "tiny_debug", "--model", tiny_model, "--trainer", "torch", "--steps", 1,
             "--dataset", "data/qa.jsonl", "--prompt-key", "question", "--answer-key", "answer",
             "--reward", "my_reward.py:compute_score"]
    train(home, *flags)
    train(home, *flags)  # the same command again: a new run, not "already holds a run"
    runs = sorted(p for p in (home / "runs").iterdir() if p.name != "latest")
    assert len(runs) == 2 and all(records(r)[0]["step"] == 0 for r in runs)
    latest = home / "runs" / "latest"
    assert latest.is_symlink() and latest.resolve() == runs[1].resolve()

    # From another directory, the dataset named by another spelling of the same file: the saved
    # paths are absolute, so nothing is missing and nothing "differs".
    train(elsewhere, "--resume", latest, "--steps", 2, "--dataset", home / "data" / ".." / "data" / "qa.jsonl")
    assert [r["step"] for r in records(runs[1])] == [0, 1] and [r["step"] for r in records(runs[0])] == [0]
    assert all(r["reward_num_failed"] == 0 and r["mean_reward"] == 0.5 for r in records(runs[1]))
    saved = json.loads((runs[1] / "state" / "config.json").read_text())
    assert Path(saved["dataset"]).is_absolute() and Path(saved["reward"].rpartition(":")[0]).is_absolute()


def test_a_new_run_path_never_reuses_a_name_and_latest_moves_in_one_rename(tmp_path):
    first = new_run_path(tmp_path)
    first.mkdir()
    second = new_run_path(tmp_path)
    assert second != first and not second.exists()
    latest = tmp_path / "latest"
    assert link_latest(first, latest) is None and followed(latest) == first
    second.mkdir()
    assert link_latest(second, latest) is None and latest.resolve() == second.resolve()
    assert sorted(os.listdir(tmp_path)) == sorted([first.name, second.name, "latest"])  # no link left behind


def test_an_old_runs_latest_directory_is_kept_and_the_new_run_said(tmp_path):
    latest = tmp_path / "latest"
    (latest / "state").mkdir(parents=True)
    run = tmp_path / "20260101-000000"
    assert "kept" in link_latest(run, latest) and str(run) in link_latest(run, latest)
    assert latest.is_dir() and not latest.is_symlink() and (latest / "state").is_dir()
