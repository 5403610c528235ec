"""The reward and training stages' latency models (the rollout's is engine.py)."""

from __future__ import annotations

import math

import numpy as np

from rollpacker.core.cost_model import ModelShape

from .constants import RewardConstants, TrainConstants


class RewardModel:
    """Scorer execution times (log-normal, a share never returns) and correctness (a per-prompt
    pass rate drawn uniformly, so groups have reward variance).  Each execution's time is drawn
    afresh, a re-run (hedge) too: the model is a sandbox whose slowness and hangs are the
    execution's (a busy node, a stuck container), not the answer's."""

    def __init__(self, constants: RewardConstants, seed: int) -> None:
        self.c = constants
        self.rng = np.random.default_rng([seed, 31])
        self.pass_rate: dict[int, float] = {}

    def draw(self, prompt_index: int) -> tuple[float, bool]:
        """(execution seconds or inf for a hang, correct?)"""
        rate = self.pass_rate.setdefault(prompt_index, float(self.rng.random()))
        correct = bool(self.rng.random() < rate)
        return self.execution_s(), correct

    def execution_s(self) -> float:
        """One execution's seconds (inf: it hangs); a re-run of the same answer draws afresh."""
        if self.rng.random() < self.c.hang_rate:
            return math.inf
        return float(self.c.median_s * math.exp(self.c.sigma * self.rng.standard_normal()))


TRAIN_TERMS = ("micro_batch_overhead_s", "seconds_per_padded_token", "seconds_per_token")
"""A calibrated trainer's constants (`fit_train`), in the order of `train_features`."""


class TrainModel:
    """Time of a training micro-batch: overhead + tokens * factor * params / (gpus * F * MFU), or with a
    calibrated trainer (`seconds_per_token` > 0) overhead + padded * seconds_per_padded_token + tokens *
    seconds_per_token (padded: rows x the longest prompt + response)."""

    def __init__(self, constants: TrainConstants, model: ModelShape, gpus: int, flops: float) -> None:
        self.c = constants
        self.per_token = constants.seconds_per_token or (
            constants.flops_per_token_factor * model.params / (gpus * flops * constants.mfu))

    def micro_batch_s(self, tokens: int, padded: int = 0) -> float:
        return self.c.micro_batch_overhead_s + tokens * self.per_token + padded * self.c.seconds_per_padded_token


def train_features(rows: int, prompt: int, response: int) -> list[float]:
    """A micro-batch of `rows` samples of `prompt` + `response` tokens, as `TRAIN_TERMS` count it."""
    return [1.0, rows * (prompt + response), rows * response]


def fit_train(timings: list[tuple[int, int, int, float]]) -> dict[str, float]:
    """`TRAIN_TERMS` fitted to (rows, prompt, response, seconds) of timed micro-batches."""
    from .engine_profile import fit_linear

    return fit_linear([train_features(*t[:3]) for t in timings], [t[3] for t in timings], TRAIN_TERMS)
