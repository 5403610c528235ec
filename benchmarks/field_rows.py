"""The tables of benchmarks/field_table.py: one row per policy, medians and ranges over seeds.

Every time is per P trained prompts (a step's worth of training, whatever the policy's rounds:
rollpacker/sim/metrics.py `epoch_totals`), so a policy that trains fewer prompts in a window does
not look faster for it; the whole step includes the TP switch, the reward wait and exposed training."""

from __future__ import annotations

import numpy as np

from rollpacker.sim import SimConfig, SimConstants, Simulation
from rollpacker.sim.metrics import epoch_totals, totals

STEP, ROLLOUT = "step_s_per_batch", "rollout_s_per_batch"

HEADER = ["| policy | whole step s (per P; switch + rollout + reward + exposed train) | vs sync | vs best sync | "
          "rollout s (per P) | vs sync | vs best sync | floor s/step | rollout / floor | tail s (last 10%) | "
          "tokens/s | wasted tok | on-policy tok | lost / dup | pending at end | TP switches | "
          "kept len / sync's kept, / workload mean | kept / launched reward |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]


def run_totals(config: SimConfig, constants: SimConstants, window: int | None) -> dict:
    """One run's totals, per P trained: its epochs (`config.epochs`), or `window` steps averaged over
    whole periods of short + long rounds with the backlog at the window's end."""
    sim = Simulation(config, constants)
    result = sim.run()
    t = result["total"]
    if window:
        t = totals(whole_periods(result["steps"])) | {k: t[k] for k in ("lost_prompts", "duplicate_prompts",
                                                                        "pending_prompts")}
        t |= epoch_totals(t, config.prompts, 0, 0)
    t["tp"], t["tps"] = config.tp, sorted({s["tp"] for s in result["steps"]})
    t["launch_tp"] = result["steps"][0]["tp"]
    """The TP the engines start at: the first round's (the plan's first choice; no switch charged)."""
    t["workload_mean_length"] = sim.workload.mean_length()
    for stage in ("tp_switch_s", "reward_s", "train_exposed_s"):
        t[stage + "_per_batch"] = t[stage] * config.prompts / t["trained_prompts"]
    return t


def whole_periods(steps: list[dict]) -> list[dict]:
    """Steps up to and including the last long round (all steps if there is none)."""
    longs = [i for i, s in enumerate(steps) if s["long_rounds"]]
    return steps[: longs[-1] + 1] if longs else steps


def spread(values: list[float], fmt: str) -> str:
    """median (min-max) over seeds; the median alone for one seed."""
    med = float(np.median(values))
    if len(values) == 1:
        return format(med, fmt)
    return f"{med:{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def ratios(runs: list[dict], over: list[dict], key: str = STEP) -> list[float]:
    """Per seed: over's time / runs' (runs faster -> above 1)."""
    return [o[key] / r[key] for r, o in zip(runs, over)]


def best_sync(results: dict, block: tuple, syncs: list[str], key: str = STEP) -> list[dict]:
    """Per seed, the fastest of the block's sync rows by `key`."""
    per_label = [results[block + (label,)] for label in syncs]
    return [min(runs, key=lambda t: t[key]) for runs in zip(*per_label)]


def med(runs: list[dict], key: str) -> float:
    return float(np.median([t[key] for t in runs]))


def backlog(runs: list[dict]) -> int:
    """Prompts drawn and not trained at the window's end, summed over seeds (0 under the epoch measure)."""
    return sum(t["pending_prompts"] for t in runs)


def length_bias(runs: list[dict], sync: list[dict]) -> str:
    """Kept mean length over sync's kept mean on the same seed, and over the workload's mean: a deferred
    prompt's samples are counted once (kept), unlike a kept / launched ratio."""
    over_sync = [t["kept_mean_length"] / s["kept_mean_length"] for t, s in zip(runs, sync)]
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
