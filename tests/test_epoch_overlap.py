"""A step whose prompts span two epochs can train a row twice (once from each epoch's order): the
trainer says so at the start exactly when the core can do it (played on the test harness)."""

from __future__ import annotations

from collections import Counter

import pytest

from helpers import RandomBackend
from rollpacker.core import Scheduler
from rollpacker.core.policies import make_policy
from rollpacker.train.progress import epoch_line

STEPS = 20


def steps_with_a_row_twice(policy: str, rows: int, prompts: int, seed: int) -> int:
    """Steps of a run on the harness whose trained prompts hold one row (index) from two epochs."""
    sched = Scheduler(make_policy(policy, prompts=prompts, samples=2, max_tokens=200), num_prompts=rows, seed=seed)
    backend = RandomBackend(sched, seed=seed, max_tokens=200)
    twice = 0
    for _ in range(STEPS):
        start = len(backend.micro_batches)
        backend.run_step()
        keys = {ref.sample.prompt for mb in backend.micro_batches[start:] for ref in mb.samples}
        twice += any(n > 1 for n in Counter(key.index for key in keys).values())
    return twice


@pytest.mark.parametrize("policy, rows, prompts, noted", [
    ("sync", 8, 4, False),  # every step one half of an epoch
    ("sync", 6, 4, True),  # every other step spans two epochs
    ("tail", 8, 4, True),  # draws ahead of training: steps span epochs whatever the rows
    ("tail", 200, 4, False),  # the run stays in one epoch
])
def test_the_start_notes_a_row_trained_twice_in_a_step_exactly_when_it_can_happen(policy, rows, prompts, noted):
    line = epoch_line(policy, prompts, STEPS, rows)
    assert (line is not None) == noted, line
    twice = sum(steps_with_a_row_twice(policy, rows, prompts, seed) for seed in range(3))
    assert (twice > 0) == noted, f"{twice} steps trained a row twice"
    if noted:
        assert line.startswith(f"note: {STEPS} steps of P={prompts} prompts go past one epoch of {rows} rows")
        assert "\n" not in line
