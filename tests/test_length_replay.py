"""Length replay through the reference trainer's real path (Session: the core, the live driver, the
embedded engine decoding real tokens, real reward workers and trainer): every request stops at the
length the workload gives its (prompt, sample), as the simulator draws it, and nothing the scheduler
(and so its policy) holds reaches the trace.  The same on SGLang servers: test_sglang_engine.py."""

from __future__ import annotations

import gc
import types

import pytest

from rollpacker.backends.length_replay import LengthReplay
from rollpacker.core.errors import ConfigError
from rollpacker.sim.workloads import Workload
from rollpacker.train.config import parse
from rollpacker.train.outputs import RunDir
from rollpacker.train.replay import ReplayOptions
from rollpacker.train.session import Session

MAX_TOKENS = 48
FLAGS = ("--preset", "tiny_debug", "--trainer", "torch", "--prompts", "3", "--samples", "3", "--max-tokens",
         str(MAX_TOKENS), "--engine-capacity", "16", "--dataset-size", "12", "--replay-lengths", "servegen-r1",
         "--replay-scale-from", "2048")


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """Four steps of tail batching replaying servegen-r1 (2048 trace tokens -> 48): the session and its records."""
    from rollpacker.backends.models import tiny_random_llama

    config = parse([*FLAGS, "--model", str(tiny_random_llama()), "--policy", "tail", "--out",
                    str(tmp_path_factory.mktemp("replay") / "run")])
    config.validate()
    session = Session(config, RunDir(config.out))
    try:
        records = [session.run_step() for _ in range(4)]
        yield session, records
    finally:
        session.close()


def expected_lengths(session) -> dict[int, list[int]]:
    """The workload's lengths of each prompt's samples, in order, drawn afresh (as the simulator draws them)."""
    prompts = session.prompts
    workload = ReplayOptions(replay_lengths="servegen-r1", replay_scale_from=2048).workload(
        len(prompts), [len(prompts.prompt_ids(i)) for i in range(len(prompts))], session.config.seed, MAX_TOKENS)
    return {i: [workload.sample(i, 0) for _ in range(40)] for i in range(len(prompts))}


@pytest.mark.timeout(300)
def test_every_request_stops_at_its_trace_length(replayed):
    session, records = replayed
    expected, seen = expected_lengths(session), {}
    reasons = set()
    for record in records:
        for prompt, tokens, reason, *_ in record["requests"]:  # in launch order
            k = seen[prompt] = seen.get(prompt, -1) + 1
            target = expected[prompt][k]
            reasons.add(reason)
            if reason == "abort":
                assert tokens <= target
            else:
                assert tokens == target, (prompt, k, tokens, target)
                assert reason == ("length" if target == MAX_TOKENS else "stop")
    assert {"stop", "abort"} <= reasons  # tail batching aborted the rest of each short round
    assert len({t for lengths in expected.values() for t in lengths}) > 10  # the trace's spread, not one length


@pytest.mark.timeout(300)
def test_each_request_says_when_it_was_launched_and_answered_within_its_round(replayed):
    """`request_spans`: [launch, answer] of each of `requests`, seconds from the step's start, within the
    round, which ends with the last answer."""
    _, records = replayed
    for record in records:
        spans = record["request_spans"]
        assert len(spans) == len(record["requests"]) > 0
        assert all(0 <= start <= end <= record["rollout_s"] + 1e-3 for start, end in spans), (spans, record["rollout_s"])
        assert max(end for _, end in spans) == pytest.approx(record["rollout_s"], abs=5e-3), "the last answer ends the round"
        assert record["ways_back"] == record["ways_in"] == [None] * len(spans)  # (the embedded engine does not say)


@pytest.mark.timeout(300)
def test_each_abort_call_is_recorded_before_the_answers_it_caused(replayed):
    """`abort_calls`: [when, how many] of each abort sent; every aborted answer comes after the first call, and the
    calls named at least as many requests as came back aborted (a request that finished first answers "stop")."""
    _, records = replayed
    aborted_rounds = 0
    for record in records:
        calls = record["abort_calls"]
        aborted = [end for (_, _, reason, *_), (_, end) in zip(record["requests"], record["request_spans"])
                   if reason == "abort"]
        assert sum(count for _, count in calls) >= len(aborted)
        assert all(0 <= at <= record["rollout_s"] + 1e-3 and count > 0 for at, count in calls), calls
        if aborted:
            aborted_rounds += 1
            assert min(aborted) >= calls[0][0], (aborted, calls)
    assert aborted_rounds > 0  # tail batching aborted the rest of its short rounds


@pytest.mark.timeout(300)
def test_nothing_the_scheduler_holds_reaches_the_trace(replayed):
    """The policy is the scheduler's: a policy that wanted the trace lengths could reach only what the
    scheduler reaches, and that holds neither the replay nor its workload (while the engine does)."""
    session, _ = replayed
    assert isinstance(session.engine, LengthReplay)
    assert reaches(session.engine, Workload)  # the walk does find the trace where it is
    assert not reaches(session.scheduler, (Workload, LengthReplay))
    assert not reaches(session.scheduler.policy, (Workload, LengthReplay))


SKIPPED = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.CodeType, types.FrameType)


def reaches(root, kinds, limit: int = 500_000) -> bool:
    """Whether an object of `kinds` is reachable from `root` through object references (modules, classes and
    functions left out: through their globals everything reaches everything)."""
    seen, todo = set(), [root]
    while todo and len(seen) < limit:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, SKIPPED):
            continue
        seen.add(id(obj))
        if isinstance(obj, kinds):
            return True
        todo.extend(gc.get_referents(obj))
    assert len(seen) < limit, "the walk was cut short"
    return False


@pytest.mark.parametrize("flags,message", [
    (("--replay-lengths", "no-such-trace"), "--replay-lengths 'no-such-trace': no such file"),
    (("--replay-lengths", "synthetic-bimodal", "--replay-scale-from", "100"), "--replay-scale-from applies to"),
    (("--replay-scale-from", "100"), "--replay-scale-from applies to"),
    (("--replay-lengths", "servegen-r1", "--replay-scale-from", "0"), "--replay-scale-from must be >= 1"),
])
def test_bad_replay_flags_are_one_line_naming_the_flag(flags, message):
    config = parse(["--preset", "tiny_debug", *flags])
    with pytest.raises(ConfigError, match=message):
        config.validate()
