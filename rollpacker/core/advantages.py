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

import math
from collections.abc import Sequence

ADVANTAGES = ("grpo", "grpo-mean", "rloo")


def advantages(rewards: Sequence[float], kind: str, eps: float) -> list[float]:
    """The advantage of each response of one group, from the group's rewards.  Plain Python: a
    group is a handful of numbers, where numpy's per-call overhead would cost ten times more."""
    n = len(rewards)
    mean = sum(rewards) / n
    if kind == "grpo":
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / n)
        return [(r - mean) / (std + eps) for r in rewards]
    if kind == "grpo-mean":
        return [r - mean for r in rewards]
    if n < 2:  # rloo
        return [0.0] * n
    total = sum(rewards)
    return [r - (total - r) / (n - 1) for r in rewards]
