"""Training tasks from reasoning-gym: seeded problems, chat-template prompts, answer extraction and
scoring, with no network.

SmolLM2-135M-Instruct ignores "<answer>" tags (checked on its replies), so for numeric tasks the answer is the
last number in the reply; the task's own `score_answer` grades it, and for free-form math tasks
math-verify also grades the whole reply (the reward is the better of the two).  `score` is what the
reward workers run; it is a plain function of picklable arguments.

`DEFAULT_MIX` is chosen for a real length tail with this model: chain_sum answers short,
basic_arithmetic medium, gsm_symbolic (word problems) long; the easy settings keep the reward
non-zero often enough for GRPO groups to differ (numbers in benchmarks/RESULTS.md).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from attrs import field, frozen

from rollpacker.backends.data.rows import PromptRow, chat_ids
from rollpacker.core.errors import ConfigError


@frozen
class TaskSpec:
    """How rollpacker uses one reasoning-gym dataset."""

    config: Mapping[str, Any] = field(factory=dict)
    """Keyword arguments for `reasoning_gym.create_dataset` (difficulty knobs)."""
    is_numeric: bool = True
    """Take the last number of the reply as the answer (else: the last non-empty line)."""
    use_math_verify: bool = False
    """Also grade the whole reply with math-verify against the gold answer."""
    instruction: str = "End your reply with the final answer as a number."


TASKS: dict[str, TaskSpec] = {
    "chain_sum": TaskSpec({"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}),
    "basic_arithmetic": TaskSpec(
        {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2, "operators": ("+", "-"),
         "allow_parentheses": False, "allow_negation": False}
    ),
    "gsm_symbolic": TaskSpec({}, use_math_verify=True),
    "countdown": TaskSpec(
        {"min_numbers": 3, "max_numbers": 4, "max_target": 200},
        is_numeric=False,
        instruction="End your reply with the expression alone on the last line.",
    ),
}

DEFAULT_MIX: dict[str, float] = {"chain_sum": 0.4, "basic_arithmetic": 0.3, "gsm_symbolic": 0.3}


class UnknownTask(ConfigError):
    """A task name rollpacker does not know."""


def task_spec(name: str) -> TaskSpec:
    try:
        return TASKS[name]
    except KeyError:
        raise UnknownTask(f"unknown task {name!r}; valid tasks: {', '.join(sorted(TASKS))}") from None


@frozen
class Problem:
    """One prompt of the dataset: `entry` is reasoning-gym's own record (question, answer,
    metadata), passed unchanged to the scorer."""

    task: str
    index: int
    question: str
    answer: str
    entry: Mapping[str, Any]


def task_mix(names: Sequence[str]) -> dict[str, float] | None:
    """--tasks as a mix: each item NAME (weight 1) or NAME:WEIGHT (a number > 0); None for no items
    (the default mix).  A ConfigError names a bad item."""
    mix: dict[str, float] = {}
    for item in names:
        name, _, weight = item.partition(":")
        task_spec(name)
        try:
            mix[name] = float(weight) if weight else 1.0
        except ValueError:
            mix[name] = float("nan")
        if not mix[name] > 0:
            raise ConfigError(f"--tasks {item!r}: a weight is a number > 0 (NAME or NAME:WEIGHT)")
    return mix or None


def make_problems(mix: Mapping[str, float] | Sequence[str] | None = None, size: int = 256, seed: int = 0) -> list[Problem]:
    """`size` problems drawn from the tasks of `mix` (weights, or names with equal weight; None:
    `DEFAULT_MIX`), deterministic in `seed`, interleaved in a seeded order."""
    import random

    import reasoning_gym

    if mix is None:
        mix = DEFAULT_MIX
    if not isinstance(mix, Mapping):
        mix = {name: 1.0 for name in mix}
    if size < 1:
        raise ConfigError(f"size must be >= 1, got {size}")
    for name, weight in mix.items():
        task_spec(name)
        if not weight > 0:
            raise ConfigError(f"mix weight of {name!r} must be > 0, got {weight}")
    total = sum(mix.values())
    names = sorted(mix)
    counts = {n: int(size * mix[n] / total) for n in names}
    for n in names[: size - sum(counts.values())]:
        counts[n] += 1
    problems = []
    for k, name in enumerate(names):
        if not counts[name]:
            continue
        ds = reasoning_gym.create_dataset(name, size=counts[name], seed=seed * 1000 + k, **TASKS[name].config)
        for i in range(counts[name]):
            e = ds[i]
            problems.append(Problem(name, i, e["question"], str(e["answer"]), _plain(e)))
    random.Random(seed).shuffle(problems)
    return problems


def _plain(entry: Mapping[str, Any]) -> dict:
    """The entry as plain picklable data (reasoning-gym entries are dicts already)."""
    return dict(entry)


def rows_from_problems(problems) -> list[PromptRow]:
    """reasoning-gym `Problem`s as rows: the question plus the task's instruction as one user
    message; `extra_info["entry"]` keeps reasoning-gym's own record for its scorer."""
    return [PromptRow(messages=({"role": "user", "content": f"{p.question}\n{task_spec(p.task).instruction}"},),
                      data_source=p.task, ground_truth=p.answer, extra_info={"index": p.index, "entry": p.entry},
                      where=f"task {p.task} problem {p.index}")
            for p in problems]


def render_prompt(tokenizer, problem: Problem) -> list[int]:
    """Prompt token ids: the question plus the task's instruction, in the model's chat template."""
    return chat_ids(tokenizer, rows_from_problems([problem])[0].messages)


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def extract_answer(task: str, response: str) -> str | None:
    """The answer in a reply: the last number for numeric tasks (thousands commas dropped, a
    trailing ".0" kept as written), else the last non-empty line.  None when there is none."""
    spec = task_spec(task)
    if spec.is_numeric:
        numbers = _NUMBER.findall(response)
        return numbers[-1].replace(",", "") if numbers else None
    lines = [ln.strip() for ln in response.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else None


@lru_cache(maxsize=None)
def _scorer(task: str):
    import reasoning_gym

    return reasoning_gym.get_score_answer_fn(task)


def math_verify_score(gold: str, response: str) -> float:
    """1.0 if math-verify finds the gold answer in the reply.  Its signal-based timeouts are
    disabled (they break off the main thread); callers enforce a deadline from outside."""
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns on every call otherwise
    gold_parsed = parse(gold, parsing_timeout=None)
    answer_parsed = parse(response, parsing_timeout=None)
    return 1.0 if verify(gold_parsed, answer_parsed, timeout_seconds=None) else 0.0


def warm_up() -> None:
    """Import what `score` needs (reward workers call this before taking jobs, so the first job's
    deadline is not spent on imports)."""
    import math_verify  # noqa: F401
    import reasoning_gym  # noqa: F401

    for name in TASKS:
        _scorer(name)


def score(task: str, entry: Mapping[str, Any], response: str) -> float:
    """Reward of `response` for the problem `entry` of `task`, in [0, 1]."""
    spec = task_spec(task)
    answer = extract_answer(task, response)
    reward = float(_scorer(task)(answer, dict(entry))) if answer is not None else 0.0
    if spec.use_math_verify and reward < 1.0:
        reward = max(reward, math_verify_score(str(entry["answer"]), response))
    return reward  # NaN passes through: the executor records it as a failure
