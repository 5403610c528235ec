"""Length bias of what a policy trains: kept samples against every sample it launched.

A policy that keeps the first R of eta x R answers, or trains short groups first, trains shorter
answers than the model writes.  Lengths come from the workload (a launched sample's full length is
the one the workload drew for it, whether or not it was aborted).  Reward: there is no model in the
simulator, so a length-dependent one stands in (assumption, stated with the results): a response of
n tokens is correct with probability 1 - n / max_tokens, and a truncated one never is; long
reasoning chains fail more often, as in the papers' traces.
"""

from __future__ import annotations

import numpy as np


def expected_reward(lengths, max_tokens: int) -> np.ndarray:
    """The stand-in reward model: 1 - n / max_tokens, 0 when truncated at max_tokens."""
    n = np.asarray(lengths, dtype=float)
    return np.where(n >= max_tokens, 0.0, 1.0 - n / max_tokens)


def bias_record(kept: list[int], launched: list[int], max_tokens: int) -> dict:
    """Sums (so that steps add up) of lengths and stand-in rewards, kept vs launched."""
    return {
        "bias_kept_samples": len(kept),
        "bias_kept_length_sum": float(sum(kept)),
        "bias_kept_reward_sum": float(expected_reward(kept, max_tokens).sum()) if kept else 0.0,
        "bias_launched_samples": len(launched),
        "bias_launched_length_sum": float(sum(launched)),
        "bias_launched_reward_sum": float(expected_reward(launched, max_tokens).sum()) if launched else 0.0,
    }


BIAS_SUMS = tuple(bias_record([], [], 1))


def bias_means(total: dict) -> dict:
    """Means from the summed fields: kept vs launched length and reward."""
    def mean(kind: str, what: str) -> float:
        n = total[f"bias_{kind}_samples"]
        return total[f"bias_{kind}_{what}_sum"] / n if n else 0.0
    return {f"{kind}_mean_{what}": mean(kind, what) for kind in ("kept", "launched") for what in ("length", "reward")}
