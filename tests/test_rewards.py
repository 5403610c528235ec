"""The reward executor with real worker processes: right rewards for right and wrong answers, a
scorer that hangs is cut at its deadline and its worker replaced, raising and NaN are recorded
failures with reward 0."""

from __future__ import annotations

import math
import os
import sys
import time

import pytest

from rollpacker.backends.rewards.pool import FAILURE_KINDS, ProcessRewardExecutor
from rollpacker.backends.rewards.worker import score_job
from rollpacker.backends.data.tasks import UnknownTask, make_problems
from rollpacker.backends.errors import BackendMisuse
from rollpacker.core.errors import ConfigError, SchedulerMisuse
from rollpacker.core.protocols import RewardExecutor, RewardJob


# Scorers for the failure tests: module-level so spawned workers can unpickle them.
def scorer_by_response(task, entry, response):
    if response == "hang":
        time.sleep(3600)
    if response == "raise":
        raise RuntimeError("scorer exploded")
    if response == "nan":
        return math.nan
    if response == "exit":
        sys.exit(3)
    if response == "os_exit":
        os._exit(3)
    if response == "none":
        return None
    if response.startswith("acc="):
        return {"score": 1.0, "acc": float(response[4:])}
    return float(response)


def collect(executor, n, timeout=60.0):
    outcomes, end = {}, time.monotonic() + timeout
    while len(outcomes) < n and time.monotonic() < end:
        for o in executor.poll(0.5):
            assert o.request_id not in outcomes, "one outcome per job"
            outcomes[o.request_id] = o
    assert len(outcomes) == n, f"only {len(outcomes)} of {n} outcomes"
    return outcomes


@pytest.mark.timeout(120)
def test_task_answers_scored_right():
    problems = make_problems(["chain_sum", "gsm_symbolic"], size=4, seed=3)
    with ProcessRewardExecutor(num_workers=2) as ex:
        assert isinstance(ex, RewardExecutor)
        for i, p in enumerate(problems):
            ex.submit(RewardJob(f"right{i}", p.task, p.entry, f"Let me think. The answer is {p.answer}.", 30.0))
            ex.submit(RewardJob(f"wrong{i}", p.task, p.entry, f"The answer is {int(p.answer) + 1}.", 30.0))
            ex.submit(RewardJob(f"none{i}", p.task, p.entry, "I do not know.", 30.0))
        out = collect(ex, 3 * len(problems))
        report = ex.step_report()
    for i in range(len(problems)):
        assert out[f"right{i}"].status == "ok" and out[f"right{i}"].reward == 1.0
        assert out[f"wrong{i}"].reward < 0.1
        assert out[f"none{i}"].reward < 0.1
    assert report.num_scored == 12 and report.num_failed == 0


@pytest.mark.timeout(120)
def test_math_verify_grades_free_form_answer():
    p = make_problems(["gsm_symbolic"], size=1, seed=5)[0]
    with ProcessRewardExecutor(num_workers=1) as ex:
        # the last number is wrong, but the boxed answer is right: math-verify finds it
        ex.submit(RewardJob("boxed", p.task, p.entry, f"So $\\boxed{{{p.answer}}}$, checked in 2 steps.", 30.0))
        out = collect(ex, 1)
    assert out["boxed"].reward == 1.0


@pytest.mark.timeout(120)
def test_hang_raise_nan_are_failures_and_pool_keeps_working():
    with ProcessRewardExecutor(num_workers=2, scorer=scorer_by_response) as ex:
        # wait for the workers to be up so the deadline measures the scorer, not process start
        ex.submit(RewardJob("warm", "t", None, "1", 30.0))
        collect(ex, 1)
        ex.step_report()
        start = time.monotonic()
        ex.submit(RewardJob("hang", "t", None, "hang", 1.0))
        ex.submit(RewardJob("raise", "t", None, "raise", 5.0))
        ex.submit(RewardJob("nan", "t", None, "nan", 5.0))
        for i in range(4):
            ex.submit(RewardJob(f"ok{i}", "t", None, str(i / 4), 5.0))
        out = collect(ex, 7, timeout=30)
        hang_done = time.monotonic() - start
        assert out["hang"].status == "timeout" and out["hang"].reward == 0.0
        assert out["raise"].status == "error" and "scorer exploded" in out["raise"].error
        assert out["raise"].reward == 0.0
        assert out["nan"].status == "nan" and out["nan"].reward == 0.0
        for i in range(4):
            assert out[f"ok{i}"].status == "ok" and out[f"ok{i}"].reward == i / 4
        assert hang_done < 10, "a hung scorer must not hold the pool past its deadline"
        # the killed worker was replaced: two more hangs and a normal job still all resolve
        ex.submit(RewardJob("hang2", "t", None, "hang", 0.5))
        ex.submit(RewardJob("hang3", "t", None, "hang", 0.5))
        ex.submit(RewardJob("after", "t", None, "0.5", 30.0))
        out2 = collect(ex, 3, timeout=60)
        assert out2["after"].reward == 0.5
        assert out2["hang2"].status == out2["hang3"].status == "timeout"
        report = ex.step_report()
        assert report.num_timed_out == 3 and report.num_errors == 1 and report.num_nan == 1
        assert report.num_scored == 5 and report.num_failed == 5
        assert report.num_workers_replaced == 3
        assert report.queue_s_max >= 0.0


@pytest.mark.timeout(60)
def test_bad_jobs_rejected():
    with ProcessRewardExecutor(num_workers=1, scorer=scorer_by_response) as ex:
        with pytest.raises(ConfigError, match="deadline_s"):
            ex.submit(RewardJob("a", "t", None, "1", 0.0))
        ex.submit(RewardJob("dup", "t", None, "hang", 1.0))
        with pytest.raises(BackendMisuse, match="dup") as info:
            ex.submit(RewardJob("dup", "t", None, "1", 1.0))
        assert not isinstance(info.value, SchedulerMisuse)  # the executor's misuse, not the core's
    with ProcessRewardExecutor(num_workers=1) as ex:
        with pytest.raises(UnknownTask, match="chain_sum"):
            ex.submit(RewardJob("x", "no_such_task", {}, "1"))


@pytest.mark.timeout(120)
def test_sys_exit_os_exit_and_none_are_failures_of_their_kind_with_a_reason():
    """sys.exit is an exception like any other; os._exit ends the worker process (the pool sees it
    die, names its exit code and starts another); None is not a reward.  Each kind's first error
    comes with the report."""
    with ProcessRewardExecutor(num_workers=1, scorer=scorer_by_response) as ex:
        for i, response in enumerate(("exit", "os_exit", "none", "nan", "exit", "hang")):
            ex.submit(RewardJob(f"{response}{i}", "t", None, response, 2.0))
        ex.submit(RewardJob("after", "t", None, "0.25", 30.0))
        out = collect(ex, 7)
        report = ex.step_report()
    assert out["after"].status == "ok" and out["after"].reward == 0.25, "the pool scores on after a dead worker"
    assert all(o.reward == 0.0 and o.failed for rid, o in out.items() if rid != "after")
    assert report.failures_by_kind == {"raised": 2, "bad_value": 2, "timeout": 1, "worker_died": 1}
    assert set(report.failures_by_kind) == set(FAILURE_KINDS)
    first = report.first_errors
    assert first["raised"].startswith("SystemExit: 3 (at ") and "in scorer_by_response" in first["raised"]
    assert "exited with code 3" in first["worker_died"]
    assert first["bad_value"].startswith("the scorer returned None") and "not a number" in first["bad_value"]
    assert "deadline" in first["timeout"]
    assert report.num_workers_replaced == 2  # the one that os._exit ended, the one that hung
    assert not any("\n" in line for line in first.values())


def returning(task, entry, response):
    """A scorer that returns its entry, whatever it is."""
    return entry


@pytest.mark.parametrize("result", ["1.0", {"score": "0.5"}, True, {"score": False}, b"1"])
def test_a_numeric_string_or_a_bool_is_a_bad_value_not_a_number(result):
    """Only an int or a float (or a dict with one as "score") is a reward: `float()` would take "1.0"
    and True, so they were rewards 1.0 though docs/your-data.md says anything else is a failure."""
    status, kind, reward, metrics, error = score_job(returning, "t", result, "r")
    assert (status, kind, reward, metrics) == ("error", "bad_value", 0.0, {})
    assert error.startswith(f"the scorer returned {result!r}: ") and "not a number" in error
    assert type(result if not isinstance(result, dict) else result["score"]).__name__ in error


@pytest.mark.parametrize("result, reward", [(1, 1.0), (0.25, 0.25), ({"score": 1, "hit": True}, 1.0)])
def test_an_int_or_a_float_is_a_reward(result, reward):
    status, kind, got, metrics, error = score_job(returning, "t", result, "r")
    assert (status, kind, got, error) == ("ok", "", reward, "")
    assert metrics == ({"hit": 1.0} if isinstance(result, dict) else {})


@pytest.mark.timeout(60)
def test_a_nan_metric_is_counted_and_named_once_not_dropped(capsys):
    """A NaN metric was left out of the step's mean with no word: a metric all NaN was missing from
    metrics.jsonl.  Now it is counted (`reward_num_nonfinite_metrics`) and its first NaN is one line."""
    with ProcessRewardExecutor(num_workers=1, scorer=scorer_by_response) as ex:
        for i, response in enumerate(("acc=nan", "acc=0.5", "acc=inf")):
            ex.submit(RewardJob(f"r{i}", "t", None, response, 30.0))
        out = collect(ex, 3)
        report = ex.step_report()
        ex.submit(RewardJob("later", "t", None, "acc=nan", 30.0))
        collect(ex, 1)
        later = ex.step_report()
    assert all(o.status == "ok" and o.reward == 1.0 for o in out.values()), "a NaN metric is no reward failure"
    assert report.metrics == {"acc": 0.5} and report.nonfinite_metrics == {"acc": 2}
    assert report.num_nonfinite_metrics == 2 and later.num_nonfinite_metrics == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "'acc' (2x)" in lines[0] and "reward_num_nonfinite_metrics" in lines[0], lines
