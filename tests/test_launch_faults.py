"""`reference/train.py --nproc 2` with a bad --dist-timeout-s: one line, once, exit 2, from the launcher
before torchrun starts (it was the line once per rank, then torchrun's 35-line traceback, exit 1)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from test_reference_train import ROOT, tiny_model  # noqa: F401 - fixture

TRAIN = ROOT / "reference" / "train.py"


@pytest.mark.timeout(200)
@pytest.mark.parametrize("flags,line", [
    (["--dist-timeout-s", "0"], "error: --dist-timeout-s must be > 0, got 0.0"),
    (["--dist-timeout-s", "nan"], "error: --dist-timeout-s must be > 0, got nan"),
    (["--dist-timeout-s", "inf"], "error: --dist-timeout-s must be > 0, got inf"),
    (["--step-timeout-s", "200", "--dist-timeout-s", "100"],
     "error: --dist-timeout-s 100 must exceed --step-timeout-s 200: the other ranks wait in a collective while "
     "rank 0 runs a step"),
])
def test_a_bad_dist_timeout_with_nproc_is_one_line_once_before_torchrun(tiny_model, tmp_path, flags, line):  # noqa: F811
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, str(TRAIN), "--preset", "tiny_debug", "--model", str(tiny_model),
                           "--trainer", "torch", "--nproc", "2", "--out", str(out), *flags],
                          capture_output=True, text=True, timeout=150, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip() == line, proc.stderr[-3000:]  # no torchrun banner, no per-rank copies, no traceback
    assert not out.exists(), "refused before --out was taken"


@pytest.mark.timeout(300)
def test_a_rank_that_fails_after_launch_is_its_line_and_exit_code_without_torchruns_traceback(tiny_model, tmp_path):  # noqa: F811
    """Rank 0 finds the rollout server down after the ranks started: its one line, exit 2; the follower
    is released (no "lost rank 0" line) and torchrun's traceback of the failed child is not printed."""
    proc = subprocess.run([sys.executable, str(TRAIN), "--preset", "tiny_debug", "--model", str(tiny_model),
                           "--trainer", "torch", "--nproc", "2", "--rollout", "sglang", "--sglang-urls",
                           "http://127.0.0.1:1", "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "ChildFailedError" not in proc.stderr, proc.stderr[-3000:]
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert line.startswith("error: server http://127.0.0.1:1: /health unreachable"), line
    assert "OMP_NUM_THREADS" not in proc.stderr  # torchrun's banner: the launcher sets it as torchrun would
