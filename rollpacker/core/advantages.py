"""Group advantages: how much better each response of a prompt's group did than its siblings.

GRPO needs no critic: the baseline of a response is the group of R responses to the same prompt.

    "grpo"       (r_i - mean) / (std + eps), the group's population std (DeepSeekMath GRPO)
    "grpo-mean"  r_i - mean (Dr. GRPO: no std normalisation, no difficulty bias)
    "rloo"       r_i - mean of the other R-1 rewards (leave-one-out; 0 for a group of one)

Every estimator keeps the order and the sign of r_i - mean: a response rewarded above its group's
mean gets a positive advantage, so the policy gradient moves towards it.  Each sums to zero over a
group.
"""

from __future__ import annotations

import numpy as np

ADVANTAGES = ("grpo", "grpo-mean", "rloo")


def advantages(rewards: np.ndarray, kind: str, eps: float) -> np.ndarray:
    """The advantage of each response of one group, from the group's rewards."""
    mean = rewards.mean()
    if kind == "grpo":
        return (rewards - mean) / (rewards.std() + eps)
    if kind == "grpo-mean":
        return rewards - mean
    n = len(rewards)
    if n < 2:
        return np.zeros_like(rewards)
    return rewards - (rewards.sum() - rewards) / (n - 1)  # rloo
