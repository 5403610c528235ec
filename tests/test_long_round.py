"""benchmarks/long_round.py's decomposition of a long round: the longest request decoded alone on
the simulator's instance model is never faster than the floor's path bound, and is slower with fewer
drafts (fewer carried from the short round that deferred the prompt) and slower again without
speculation; a real headline-setting run's long rounds sit above their floor."""

from __future__ import annotations

import sys
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from long_round import BASE, SPEC, alone_s, report  # noqa: E402
from rollpacker.core.cost_model import CostModel  # noqa: E402
from rollpacker.sim.constants import MODELS  # noqa: E402


def test_alone_times_order_best_drafts_cold_drafts_no_speculation_above_the_path_floor():
    cost = CostModel(model=MODELS["qwen2.5-7b"], hardware=SPEC.hardware, tp=4, mem_fraction=SPEC.engine.mem_fraction)
    n = 20_000
    best, carried, cold, plain = (alone_s(cost, SPEC, 300, n, 1.0), alone_s(cost, SPEC, 300, n, 0.5),
                                  alone_s(cost, SPEC, 300, n, 0.0), alone_s(cost, BASE, 300, n, 0.0))
    floor = (cost.t0 + cost.t1) * n * attrs.evolve(SPEC.spec, enabled=True).best_slowdown(cost)
    assert floor < best < carried < cold < plain  # (the measured table: more at share 0.5 than at 0)
    assert plain > (cost.t0 + cost.t1) * n  # the context term only adds


def test_the_report_splits_the_gap_into_factors_that_multiply_to_it():
    rounds = [{"seed": 0, "step": 4, "tp": 4, "longest": 100, "carried": 0.5, "carried_any": 0.75, "round_s": 12.0, "floor_s": 8.0,
               "alone_best_s": 8.8, "alone_carried_s": 10.0, "alone_cold_s": 11.0, "alone_nospec_s": 12.5}]
    off = [dict(rounds[0], carried=0.0, round_s=13.2, alone_carried_s=11.0)]
    text = report(rounds, [0], off)
    assert "round / floor 1.50" in text
    assert "context (alone with the best drafts / floor): 1.10x" in text
    assert "drafts (alone with the carried drafts / alone with the best drafts): 1.14x" in text
    assert "sharing (the round / alone with the carried drafts): 1.20x" in text  # 1.10 x 1.14 x 1.20 = 1.50
    assert "carried drafts, saved (alone with no sibling finished / alone with the carried drafts): 1.10x" in text
    assert "round / floor 1.65; carried drafts make the long round 1.100x faster" in text
    assert "75% of a long round's requests start with a carried share above 0" in text
    assert "the longest request's prompt does in 1 of 1 long rounds" in text


def test_the_target_line_says_by_how_much_it_is_missed_and_what_every_oracle_together_leaves():
    rounds = [{"seed": 0, "step": 4, "tp": 4, "longest": 100, "carried": 0.5, "carried_any": 0.75, "round_s": 12.0, "floor_s": 8.0,
               "alone_best_s": 8.8, "alone_carried_s": 10.0, "alone_cold_s": 11.0, "alone_nospec_s": 12.5}]
    together = [dict(rounds[0], round_s=10.4)]
    text = report(rounds, [0], together=together)
    assert "round / floor 1.30 (1.154x)" in text
    assert "Measured 1.50x: missed by 1.30x; with every oracle above at once it would still be 1.30x" in text
    assert "the context and drafts factors are 1.10x x 1.14x = 1.25x" in text
    alone = report(rounds, [0])
    assert "Measured 1.50x: missed by 1.30x." in alone and "every oracle" not in alone
