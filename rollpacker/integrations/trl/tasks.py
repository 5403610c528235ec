"""rollpacker's reasoning-gym tasks (`backends.data.tasks`) as a TRL dataset and reward function:
a `prompt` column of chat messages, the task name and reasoning-gym's record (as JSON: its fields
differ by task) in columns the reward function receives.  The default mix answers short (chain_sum),
medium and long (gsm_symbolic), so response lengths spread: the tail that tail batching cuts."""

from __future__ import annotations

import json

from rollpacker.backends.data.tasks import make_problems, rows_from_problems, score


def reasoning_dataset(size: int = 64, seed: int = 0, mix=None):
    """A `datasets.Dataset` of `size` problems of `mix` (None: the default mix)."""
    from datasets import Dataset

    rows = rows_from_problems(make_problems(mix, size=size, seed=seed))
    return Dataset.from_list([{"prompt": [dict(m) for m in row.messages], "task": row.data_source,
                               "entry": json.dumps(row.extra_info["entry"], default=str)} for row in rows])


def task_reward(completions, task, entry, **kwargs) -> list[float]:
    """TRL reward function: reasoning-gym's score of each completion (the last message's text)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [score(t, json.loads(e), text) for t, e, text in zip(task, entry, texts)]
