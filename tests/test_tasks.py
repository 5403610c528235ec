"""Tasks: seeded problems, prompts in the chat template, answer extraction, scoring, and the
default model's files (found and converted with no network)."""

from __future__ import annotations

import pytest

from rollpacker.backends.models import DEFAULT_MODEL_NAME, default_model_dir, load_model
from rollpacker.backends.data.tasks import (
    DEFAULT_MIX, TASKS, UnknownTask, extract_answer, make_problems, render_prompt, score,
)
from rollpacker.core.errors import ConfigError


@pytest.mark.timeout(60)
def test_problems_are_seeded_and_follow_the_mix():
    a = make_problems(size=20, seed=4)
    b = make_problems(size=20, seed=4)
    c = make_problems(size=20, seed=5)
    assert [(p.task, p.question) for p in a] == [(p.task, p.question) for p in b]
    assert [p.question for p in a] != [p.question for p in c]
    counts = {t: sum(p.task == t for p in a) for t in DEFAULT_MIX}
    assert counts == {"chain_sum": 8, "basic_arithmetic": 6, "gsm_symbolic": 6}
    assert all(p.answer == str(p.entry["answer"]) for p in a)


@pytest.mark.timeout(60)
def test_unknown_task_and_bad_sizes():
    with pytest.raises(UnknownTask, match="valid tasks: basic_arithmetic, chain_sum, countdown, gsm_symbolic"):
        make_problems(["chain_sum", "no_such_task"], size=4)
    with pytest.raises(ConfigError, match="size"):
        make_problems(size=0)
    with pytest.raises(ConfigError, match="weight"):
        make_problems({"chain_sum": 0.0}, size=2)


@pytest.mark.timeout(60)
def test_prompt_uses_chat_template():
    assert default_model_dir().name == DEFAULT_MODEL_NAME
    _, tokenizer = load_model(None)
    p = make_problems(["chain_sum"], size=1, seed=0)[0]
    text = tokenizer.decode(render_prompt(tokenizer, p))
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")
    assert p.question in text and TASKS["chain_sum"].instruction in text


def test_extract_answer():
    assert extract_answer("chain_sum", "3 + 4 = 7. So the answer is 7.") == "7"
    assert extract_answer("chain_sum", "It is -12 and then 1,234") == "1234"
    assert extract_answer("gsm_symbolic", "about 3.50 dollars") == "3.50"
    assert extract_answer("chain_sum", "no digits here") is None
    assert extract_answer("countdown", "Try this:\n  6*4 + 1  \n\n") == "6*4 + 1"
    with pytest.raises(UnknownTask):
        extract_answer("nope", "1")


@pytest.mark.timeout(60)
def test_score_right_wrong_and_free_form():
    for p in make_problems(["chain_sum", "basic_arithmetic", "gsm_symbolic"], size=6, seed=2):
        assert score(p.task, p.entry, f"We compute step by step... the answer is {p.answer}.") == 1.0
        assert score(p.task, p.entry, f"the answer is {int(p.answer) + 3}") < 0.1
        assert score(p.task, p.entry, "") == 0.0
    g = make_problems(["gsm_symbolic"], size=1, seed=9)[0]
    # math-verify reads a boxed answer even when a later number is something else
    assert score("gsm_symbolic", g.entry, f"$\\boxed{{{g.answer}}}$ (2 steps)") == 1.0
    c = make_problems(["countdown"], size=1, seed=1)[0]
    assert score("countdown", c.entry, f"Here it is:\n{c.answer}") == 1.0


def test_tasks_take_weights_and_a_bad_one_is_named():
    from rollpacker.backends.data.tasks import task_mix

    assert task_mix(["basic_arithmetic:3", "gsm_symbolic"]) == {"basic_arithmetic": 3.0, "gsm_symbolic": 1.0}
    assert task_mix([]) is None
    for item in ("basic_arithmetic:x", "basic_arithmetic:0", "basic_arithmetic:-1", "basic_arithmetic:nan"):
        with pytest.raises(ConfigError, match=rf"--tasks '{item}': a weight is a number > 0"):
            task_mix([item])
    with pytest.raises(UnknownTask):
        task_mix(["nope:2"])
    counts = [p.task for p in make_problems(task_mix(["basic_arithmetic:3", "gsm_symbolic:1"]), size=40, seed=0)]
    assert (counts.count("basic_arithmetic"), counts.count("gsm_symbolic")) == (30, 10)


def test_a_weighted_mix_reaches_the_trainer_s_rows():
    from rollpacker.train.config import parse

    config = parse(["--tasks", "basic_arithmetic:3", "gsm_symbolic:1", "--dataset-size", "40"])
    tasks = [row.data_source for row in config.load_rows()]
    assert (tasks.count("basic_arithmetic"), tasks.count("gsm_symbolic")) == (30, 10)
