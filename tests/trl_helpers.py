"""Shared pieces of the TRL integration tests (tests/test_trl_*.py): trl imported or the test
skipped (failed under CI=true, where `make env` installs it), the tiny random model with the
default model's tokenizer, a small conversational dataset, and a GRPOConfig for a CPU step."""

from __future__ import annotations

import os
import warnings

import pytest

from tests.sglang_helpers import skip_unless_ci


def require_trl():
    """trl, or the test is skipped (failed under CI=true: `make env` installs rollpacker[trl])."""
    try:
        import trl
    except ModuleNotFoundError:
        skip_unless_ci("trl is not installed (pip install 'rollpacker[trl]'; `make env` installs it)")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    warnings.filterwarnings("ignore", module="trl")
    return trl


def tiny_model_and_tokenizer():
    from transformers import AutoTokenizer

    from rollpacker.backends.models import tiny_random_llama

    directory = tiny_random_llama()
    return str(directory), AutoTokenizer.from_pretrained(directory)


def sums_dataset(n: int):
    """n conversational prompts with an `answer` column (passed to reward functions by TRL)."""
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {i} + {2 * i}?"}],
                               "answer": str(3 * i)} for i in range(n)])


def grpo_config(tmp_path, **overrides):
    from trl import GRPOConfig

    knobs = dict(output_dir=str(tmp_path / "trl"), per_device_train_batch_size=4, num_generations=2,
                 max_completion_length=6, max_steps=1, report_to=[], logging_steps=1, use_cpu=True,
                 save_strategy="no", disable_tqdm=True, seed=3, learning_rate=1e-3,
                 bf16=False)  # float32 on CPU (TRL defaults to bf16 autocast)
    knobs.update(overrides)
    return GRPOConfig(**knobs)


class RewardInputs:
    """A reward function that records what TRL passes it; the reward depends on the row's place in
    its group, so advantages (and the loss) are non-zero even for identical (greedy) completions."""

    __name__ = "recorded"

    def __init__(self, num_generations: int) -> None:
        self.num_generations = num_generations
        self.calls: list[dict] = []

    def __call__(self, prompts, completions, completion_ids, answer, **kwargs):
        self.calls.append({"prompts": prompts, "completions": completions, "completion_ids": completion_ids,
                           "answer": answer, "keys": sorted(k for k in kwargs if k != "trainer_state")})
        return [float(i % self.num_generations) + 0.1 * len(ids) for i, ids in enumerate(completion_ids)]
