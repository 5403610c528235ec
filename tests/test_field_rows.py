"""benchmarks/field_rows.py: the field table's rows on real simulated runs (small settings)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rollpacker.sim import SimConfig, SimConstants

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from field_rows import STEP, backlog, length_bias, row, run_totals  # noqa: E402


def small(policy: str, **kw) -> SimConfig:
    return SimConfig(policy=policy, prompts=8, samples=4, max_tokens=4096, instances=2, dataset_prompts=40, **kw)


def test_a_window_row_with_a_backlog_is_flagged_and_an_epoch_row_is_not():
    window = run_totals(small("tail", steps=3), SimConstants(), window=3)
    epoch = run_totals(small("tail", epochs=1), SimConstants(), window=None)
    sync = run_totals(small("sync", epochs=1), SimConstants(), window=None)
    assert backlog([window]) > 0 and backlog([epoch]) == 0
    assert "backlog: " in row("tail", [window], [sync], [sync], [sync])
    assert "backlog" not in row("tail", [epoch], [sync], [sync], [sync])
    # per P trained: the epoch's whole seconds over its batches of P
    assert epoch[STEP] == pytest.approx(epoch["epoch_s"] * 8 / 40)


def test_length_bias_is_kept_mean_over_syncs_kept_mean_and_over_the_workload_mean():
    sync = run_totals(small("sync", epochs=1), SimConstants(), window=None)
    tail = run_totals(small("tail", epochs=1), SimConstants(), window=None)
    assert length_bias([sync], [sync]).startswith("1.000, ")
    over_sync, over_workload = map(float, length_bias([tail], [sync]).split(", "))
    assert over_sync == pytest.approx(tail["kept_mean_length"] / sync["kept_mean_length"], abs=1e-3)
    assert over_workload == pytest.approx(tail["kept_mean_length"] / tail["workload_mean_length"], abs=1e-3)
