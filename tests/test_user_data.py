"""Bring your own data and reward: --dataset in veRL's layout and a plain one, --reward math and a
user function with veRL's signature, run by real reward workers and the reference trainer on the
tiny random Llama; bad input is one line naming the file, row and key (or the flag)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rollpacker.backends.rewards import functions as reward_fns
from rollpacker.backends.rewards.pool import ProcessRewardExecutor
from rollpacker.core.errors import ConfigError
from rollpacker.core.protocols import RewardJob
from rollpacker.train.config import parse
from test_reference_train import ROOT, records, run_train, tiny_model  # noqa: F401 - fixture

USER_REWARD = textwrap.dedent('''
    import math, time

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        """veRL's signature; what it does depends on the row, so a test can pick a behaviour."""
        mode = (extra_info or {}).get("mode", "dict")
        if mode == "hang":
            time.sleep(3600)
        if mode == "raise":
            raise RuntimeError("reward exploded")
        if mode == "nan":
            return math.nan
        if mode == "no-score":
            return {"acc": 1.0}
        return {"score": float(str(ground_truth) in solution_str), "chars": len(solution_str),
                "from_source": float(data_source == "toy"), "note": "not a metric"}
''')


@pytest.fixture(scope="module")
def math_parquet(tmp_path_factory) -> Path:
    """benchmarks/make_math_dataset.py's output: 8 reasoning-gym problems in veRL's layout."""
    out = tmp_path_factory.mktemp("data") / "math.parquet"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "make_math_dataset.py"), "--out", str(out),
                    "--size", "8"], check=True, capture_output=True, timeout=120)
    return out


@pytest.fixture()
def user_reward(tmp_path) -> str:
    path = tmp_path / "my_reward.py"
    path.write_text(USER_REWARD)
    return f"{path}:compute_score"


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def verl_row(i: int, **extra) -> dict:
    return {"prompt": [{"role": "user", "content": f"What is {i} + 1?"}], "data_source": "toy",
            "reward_model": {"style": "rule", "ground_truth": str(i + 1)}, "extra_info": {"index": i, **extra}}


# -- user reward functions in the worker processes ----------------------------------------------

@pytest.mark.timeout(90)
def test_user_reward_dict_is_score_and_metrics_and_its_failures_are_reward_0(user_reward):
    def job(rid, mode, response="the answer is 3", deadline=5.0):
        return RewardJob(rid, "toy", {"ground_truth": "3", "extra_info": {"mode": mode}}, response, deadline)

    with ProcessRewardExecutor(2, scorer=reward_fns.scorer(user_reward), warmup=reward_fns.warmup(user_reward)) as ex:
        ex.submit(job("right", "dict"))
        ex.submit(job("wrong", "dict", "no idea"))
        out = collect(ex, 2)
        report = ex.step_report()
        start = time.monotonic()
        for mode in ("hang", "raise", "nan", "no-score"):
            ex.submit(job(mode, mode, deadline=1.0))
        ex.submit(job("after", "dict"))
        out.update(collect(ex, 5))
        assert time.monotonic() - start < 15, "a hung reward function held the pool past its deadline"
    assert out["right"].reward == 1.0 and out["wrong"].reward == 0.0
    assert report.metrics == {"chars": (15 + 7) / 2, "from_source": 1.0}  # "note" is not a number
    assert out["hang"].status == "timeout" and out["raise"].status == "error" and out["nan"].status == "nan"
    assert "reward exploded" in out["raise"].error and "without 'score'" in out["no-score"].error
    assert all(out[m].reward == 0.0 for m in ("hang", "raise", "nan", "no-score"))
    assert out["after"].status == "ok" and out["after"].reward == 1.0


def collect(executor, n, timeout=30.0):
    outcomes, end = {}, time.monotonic() + timeout
    while len(outcomes) < n and time.monotonic() < end:
        outcomes.update({o.request_id: o for o in executor.poll(0.5)})
    assert len(outcomes) == n, f"only {len(outcomes)} of {n} outcomes"
    return outcomes


@pytest.mark.timeout(60)
def test_math_reward_grades_against_the_ground_truth():
    entry = {"ground_truth": "114", "extra_info": {}}
    assert reward_fns.score("math", "chain_sum", entry, "98 + 93 - 77 = 114") == 1.0
    assert reward_fns.score("math", "chain_sum", entry, "so $\\boxed{114}$") == 1.0
    assert reward_fns.score("math", "chain_sum", entry, "it is 113") == 0.0
    assert reward_fns.score("reasoning-gym", "chain_sum", entry, "The answer is 114.") == 1.0


# -- training on a dataset ------------------------------------------------------------------------

@pytest.mark.timeout(300)
@pytest.mark.parametrize("reward", ["math", "user"])
def test_two_steps_on_the_verl_math_dataset(tiny_model, math_parquet, user_reward, tmp_path, reward):
    out = tmp_path / "run"
    proc = run_train("--preset", "tiny_debug", "--model", tiny_model, "--out", out, "--trainer", "torch",
                     "--dataset", math_parquet, "--reward", user_reward if reward == "user" else "math")
    assert f"dataset {math_parquet}: 8 rows" in proc.stdout
    rs = records(out)
    assert [r["step"] for r in rs] == [0, 1]
    trained = [k for r in rs for k in r["trained"]]
    assert len(trained) == len(set(trained)) == 4
    for r in rs:
        assert r["reward_num_scored"] >= 4 and r["reward_num_failed"] == 0
        if reward == "user":  # the dict's other keys are metrics; the rows came from reasoning-gym tasks
            assert r["reward_metric_chars"] > 0 and r["reward_metric_from_source"] == 0.0


@pytest.mark.timeout(300)
def test_plain_layout_with_a_hanging_reward_and_a_skipped_long_row(tiny_model, user_reward, tmp_path):
    """--prompt-key/--answer-key; one row's reward hangs every time (a recorded timeout, the step goes
    on); a row too long for the context is skipped with --skip-long-rows and counted at the start."""
    data = write_jsonl(tmp_path / "plain.jsonl", [
        {"question": "What is 2 + 1?", "answer": "3", "mode": "hang"},
        {"question": "word " * 2100, "answer": "0", "mode": "dict"},
        {"question": "What is 4 + 1?", "answer": "5", "mode": "dict"},
    ])
    out = tmp_path / "run"
    proc = run_train("--preset", "tiny_debug", "--model", tiny_model, "--out", out, "--trainer", "torch",
                     "--policy", "sync", "--dataset", data, "--prompt-key", "question", "--answer-key", "answer",
                     "--reward", user_reward, "--reward-deadline-s", "1", "--skip-long-rows")
    assert f"dataset {data}: 3 rows" in proc.stdout and "1 skipped" in proc.stdout and "rows 1)" in proc.stdout
    rs = records(out)
    assert [r["step"] for r in rs] == [0, 1]
    for r in rs:  # each step trains both kept rows: the hanging row's 2 samples time out
        assert r["trained_prompts"] == 2 and r["reward_num_timed_out"] == 2 and r["reward_failures"] == 2
        assert r["reward_metric_from_source"] == 0.0  # data_source defaults to the file's stem
    # a resume reads the file again: one that changed since the run started is refused, naming it
    data.write_text(data.read_text().replace('"answer"', '"answer" ', 1))
    proc = run_train("--resume", out, "--steps", "3", check=False, timeout=100)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"the --dataset file {data} changed since the run started" in proc.stderr


# -- bad input ------------------------------------------------------------------------------------

def bad_files(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (flags, what the one line must contain)."""
    missing = write_jsonl(tmp / "missing.jsonl", [verl_row(0), {**verl_row(1), "reward_model": {"style": "rule"}}])
    (tmp / "empty.parquet").write_bytes(b"")
    (tmp / "broken.jsonl").write_text(json.dumps(verl_row(0)) + "\n{not json\n")
    plain = write_jsonl(tmp / "plain.jsonl", [{"q": "hi", "a": "1"}])
    source = write_jsonl(tmp / "source.jsonl", [verl_row(0), verl_row(1)])
    empty_prompt = write_jsonl(tmp / "empty_prompt.jsonl", [verl_row(0), {**verl_row(1), "prompt": []}])
    return {
        "missing key": (["--dataset", missing], f"{missing} row 1: key 'reward_model.ground_truth'"),
        "empty file": (["--dataset", tmp / "empty.parquet"], "holds no rows"),
        "not json": (["--dataset", tmp / "broken.jsonl"], "broken.jsonl line 2: not valid JSON"),
        "no such file": (["--dataset", tmp / "nope.jsonl"], "nope.jsonl: no such file"),
        "answer key": (["--dataset", plain, "--prompt-key", "q", "--answer-key", "answer"],
                       "key 'answer' (--answer-key) is missing"),
        "half plain": (["--dataset", plain, "--prompt-key", "q"], "--prompt-key and --answer-key"),
        "empty prompt": (["--dataset", empty_prompt], "empty_prompt.jsonl row 1: key 'prompt'"),
        "rg source": (["--dataset", source, "--reward", "reasoning-gym"], "source.jsonl row 0: key data_source"),
        "reward name": (["--reward", "nosuch"], "--reward 'nosuch'"),
        "reward fn": (["--reward", f"{missing}.py:f"], "no such file"),
        "reward module": (["--reward", "no_such_module_xyz:f"], "no module named 'no_such_module_xyz'"),
        "too many prompts": (["--dataset", source, "--prompts", "3"], "--prompts (3) is larger"),
    }


@pytest.mark.timeout(120)
def test_bad_dataset_or_reward_is_a_config_error_naming_file_row_and_key(tmp_path):
    for name, (flags, needle) in bad_files(tmp_path).items():
        config = parse(["--preset", "tiny_debug", "--trainer", "torch", "--device", "cpu", *map(str, flags)])
        with pytest.raises(ConfigError) as caught:
            config.validate()
        assert needle in str(caught.value), (name, str(caught.value))
        assert "\n" not in str(caught.value), name
    with pytest.raises(ConfigError, match="--dataset-size is for --tasks"):  # not silently ignored
        parse(["--dataset", str(tmp_path / "any.jsonl"), "--dataset-size", "4"])


@pytest.mark.timeout(200)
def test_reward_function_with_a_wrong_signature_and_a_long_row_fail_before_the_model_loads(tiny_model, tmp_path):
    (tmp_path / "two_args.py").write_text("def compute_score(solution_str, ground_truth):\n    return 0.0\n")
    data = write_jsonl(tmp_path / "long.jsonl", [verl_row(0), verl_row(1, pad=1) | {
        "prompt": [{"role": "user", "content": "word " * 2100}]}])
    cases = [(["--reward", f"{tmp_path / 'two_args.py'}:compute_score"], ("--reward", "veRL's compute_score")),
             (["--dataset", data], (f"{data} row 1: key prompt is", "context of 2048", "--skip-long-rows"))]
    for flags, needles in cases:
        proc = run_train("--preset", "tiny_debug", "--model", tiny_model, "--out", tmp_path / "run", "--trainer",
                         "torch", *flags, check=False, timeout=100)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
        assert all(needle in line for needle in needles), line
        assert "Loading weights" not in proc.stderr
