"""The tables of benchmarks/field_table.py: one row per policy, medians and ranges over seeds.

Every time is per P trained prompts (a step's worth of training, whatever the policy's rounds:
rollpacker/sim/metrics.py `epoch_totals`), so a policy that trains fewer prompts in a window does
not look faster for it; the whole step includes the TP switch, the reward wait and exposed training."""

from __future__ import annotations

import numpy as np

from rollpacker.sim.compare import ROLLOUT, STEP, kept_length_ratios, med, ratios, run_totals, spread, whole_periods

__all__ = ["ROLLOUT", "STEP", "med", "ratios", "run_totals", "spread", "whole_periods"]

HEADER = ["| policy | whole step s (per P; switch + rollout + reward + exposed train) | vs sync | vs best sync | "
          "rollout s (per P) | vs sync | vs best sync | floor s/step | rollout / floor | tail s (last 10%) | "
          "tokens/s | wasted tok | on-policy tok | lost / dup | pending at end | TP switches | "
          "kept len / sync's kept, / workload mean | kept / launched reward |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]


def best_sync(results: dict, block: tuple, syncs: list[str], key: str = STEP) -> list[dict]:
    """Per seed, the fastest of the block's sync rows by `key`."""
    per_label = [results[block + (label,)] for label in syncs]
    return [min(runs, key=lambda t: t[key]) for runs in zip(*per_label)]


def backlog(runs: list[dict]) -> int:
    """Prompts drawn and not trained at the window's end, summed over seeds (0 under the epoch measure)."""
    return sum(t["pending_prompts"] for t in runs)


def length_bias(runs: list[dict], sync: list[dict]) -> str:
    """Kept mean length over sync's kept mean on the same seed, and over the workload's mean: a deferred
    prompt's samples are counted once (kept), unlike a kept / launched ratio."""
    over_sync = kept_length_ratios(runs, sync)
    over_workload = [t["kept_mean_length"] / t["workload_mean_length"] for t in runs]
    return f"{float(np.median(over_sync)):.3f}, {float(np.median(over_workload)):.3f}"


def row(name: str, runs: list[dict], sync: list[dict], best: list[dict], best_rollout: list[dict]) -> str:
    wasted = [t["wasted_tokens"] / t["generated_tokens"] for t in runs]
    pending = backlog(runs)
    flag = f" **(backlog: {pending} pending)**" if pending else ""
    return (f"| {name}{flag} | {spread([t[STEP] for t in runs], '.1f')} | {spread(ratios(runs, sync), '.2f')}x | "
            f"{spread(ratios(runs, best), '.2f')}x | {spread([t[ROLLOUT] for t in runs], '.1f')} | "
            f"{spread(ratios(runs, sync, ROLLOUT), '.2f')}x | {spread(ratios(runs, best_rollout, ROLLOUT), '.2f')}x | "
            f"{med(runs, 'mean_floor_s'):.1f} | {spread([t['rollout_over_floor'] for t in runs], '.2f')} | "
            f"{med(runs, 'mean_tail_s'):.1f} | {med(runs, 'tokens_per_s'):,.0f} | {float(np.median(wasted)):.0%} | "
            f"{med(runs, 'on_policy_fraction'):.2f} | {sum(t['lost_prompts'] for t in runs)} / "
            f"{sum(t['duplicate_prompts'] for t in runs)} | {pending} | {sum(t['tp_switches'] for t in runs)} | "
            f"{length_bias(runs, sync)} | {med(runs, 'kept_mean_reward'):.3f} / {med(runs, 'launched_mean_reward'):.3f} |")
