"""Comparing policies on one setting: a run's totals per P trained prompts, and ratios and spreads over
seeds (the field table's measure, benchmarks/field_rows.py, and `rollpacker advise`'s).

Every time is per P trained prompts (a step's worth of training, whatever the policy's rounds:
`metrics.epoch_totals`), so a policy that trains fewer prompts in a window does not look faster for it;
the whole step includes the TP switch, the reward wait and exposed training."""

from __future__ import annotations

import numpy as np

from .config import SimConfig
from .constants import SimConstants
from .metrics import epoch_totals, totals
from .simulation import Simulation

STEP, ROLLOUT = "step_s_per_batch", "rollout_s_per_batch"


def run_totals(config: SimConfig, constants: SimConstants, window: int | None, sim: Simulation | None = None) -> dict:
    """One run's totals, per P trained: its epochs (`config.epochs`), or `window` steps averaged over
    whole periods of short + long rounds with the backlog at the window's end.  `sim`: a Simulation
    of `config` to run (a subclass that records more), else a plain one."""
    sim = sim or Simulation(config, constants)
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


def med(runs: list[dict], key: str) -> float:
    return float(np.median([t[key] for t in runs]))


def kept_length_ratios(runs: list[dict], sync: list[dict]) -> list[float]:
    """Per seed: the kept samples' mean length over sync's on the same seed (a deferred prompt's samples
    counted once): below 1, the policy trains shorter answers than the model writes."""
    return [t["kept_mean_length"] / s["kept_mean_length"] for t, s in zip(runs, sync)]
