"""benchmarks/field_table.py's headline verdict: met or missed from the per-seed medians, and a missed
target says by how much (the target over the median ratio) and where its cause is measured."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from field_table import OURS_BEST, STAGES, SYNCS, verdicts  # noqa: E402

HEAD = ("servegen-r1", 0.9, "32k 64x7B")


def _results(step_ratio: float, rollout_ratio: float) -> dict:
    def runs(step: float, rollout: float) -> list[dict]:
        base = {key: 1.0 for _, key in STAGES} | {"pending_prompts": 0, "lost_prompts": 0, "duplicate_prompts": 0}
        return [base | {"step_s_per_batch": step, "rollout_s_per_batch": rollout} for _ in range(3)]
    results = {HEAD + (label,): runs(100.0, 90.0) for label in SYNCS}
    results[HEAD + (OURS_BEST,)] = runs(100.0 / step_ratio, 90.0 / rollout_ratio)
    return results


def test_a_missed_headline_says_by_how_much_and_where_the_cause_is_measured():
    text = "\n".join(verdicts(_results(2.0, 2.4)))
    assert "whole step 2.00 (2.00-2.00)x sync same engine" in text
    assert "missed, by 1.25x (whole step) and 1.25x (rollout)" in text
    assert '"Long round against its floor"' in text


def test_a_met_headline_says_met():
    text = verdicts(_results(2.6, 3.2))[0]
    assert text.endswith("rollout 3.20 (3.20-3.20)x: met.")
