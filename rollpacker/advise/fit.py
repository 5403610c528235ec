"""Tier 2: a step's length distribution from its scalars alone, and a synthetic batch drawn from it.

A step's responses are taken as log-normal, cut at the cap L: `min(X, L)`, `ln X ~ N(mu, sigma^2)`.  Two
figures fix (mu, sigma): the mean response length, and the cap's mass where some responses were clipped
(`clip_ratio` = P(X >= L)), else the step's longest response as the quantile 1 - 1/(N + 1) of N = P x R.
What the scalars cannot give is how the lengths split between prompts and within a prompt's group: the
share `between` of log-length variance between prompts is an assumption, and the advice is a range over
`BETWEEN` (for each, a prompt's effect a ~ N(0, 1) and its samples `mu + sigma (sqrt(b) a + sqrt(1 - b) e)`).
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from .records import AdviseError, Group, StepScalars

BETWEEN = (0.15, 0.5, 0.9)
"""Shares of log-length variance between prompts the tier-2 advice ranges over (the field table's
calibration put RollPacker's artifact at 0.15, our multi-sample data at 0.9)."""
SIGMAS = np.linspace(0.02, 3.0, 600)
NORMAL = NormalDist()


def capped_mean(mu: np.ndarray, sigma: np.ndarray, cap: float) -> np.ndarray:
    """E[min(X, cap)] for ln X ~ N(mu, sigma^2)."""
    cdf = np.vectorize(NORMAL.cdf)
    log_cap = math.log(cap)
    return (np.exp(mu + sigma ** 2 / 2) * cdf((log_cap - mu - sigma ** 2) / sigma)
            + cap * (1 - cdf((log_cap - mu) / sigma)))


def fit_step(s: StepScalars, cap: int, batch: int) -> tuple[float, float]:
    """(mu, sigma) of a step's log-normal from its mean and its clip share or longest response."""
    if s.mean >= cap or (s.clip_ratio is not None and s.clip_ratio >= 1):
        return math.log(cap) + 10.0, 0.02  # every response at the cap
    if s.clip_ratio:
        z = NORMAL.inv_cdf(1 - s.clip_ratio)  # ln L = mu + sigma z
        mu = math.log(cap) - SIGMAS * z
    elif s.max:
        z = NORMAL.inv_cdf(1 - 1 / (batch + 1))  # the longest of N: its quantile
        mu = math.log(min(s.max, cap)) - SIGMAS * z
    else:
        raise AdviseError(f"step {s.step}: a mean length but neither the longest response nor the clip ratio: "
                          f"export response_length/max (veRL) or completions/max_length (TRL) too")
    means = capped_mean(mu, SIGMAS, cap)
    best = int(np.argmin(np.abs(means - s.mean)))
    return float(mu[best]), float(SIGMAS[best])


def synthetic_groups(scalars: list[StepScalars], cap: int, prompts: int, samples: int, between: float,
                     seed: int = 0) -> list[Group]:
    """P groups of R lengths per step, drawn from each step's fitted distribution at `between`."""
    rng = np.random.default_rng([seed, 41, int(between * 1000)])
    groups = []
    a, e = math.sqrt(between), math.sqrt(1 - between)
    for s in scalars:
        mu, sigma = fit_step(s, cap, prompts * samples)
        effect = rng.standard_normal((prompts, 1))
        z = a * effect + e * rng.standard_normal((prompts, samples))
        lengths = np.clip(np.rint(np.exp(mu + sigma * z)), 1, cap).astype(int)
        prompt_tokens = max(1, round(s.prompt_mean)) if s.prompt_mean else None
        for p, row in enumerate(lengths):
            groups.append(Group(step=s.step, prompt=f"{s.step}/{p}", lengths=tuple(int(n) for n in row),
                                reasons=tuple("length" if n >= cap else "stop" for n in row),
                                prompt_tokens=prompt_tokens))
    return groups
