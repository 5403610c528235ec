"""Bad input is refused at the boundary with a message naming the field or request."""

from __future__ import annotations

import pytest

from rollpacker.core import (
    ConfigError,
    LaunchRequest,
    RequestAborted,
    RequestFinished,
    SchedulerMisuse,
    Scheduler,
    make_policy,
    policy_knobs,
)
from rollpacker.core.planner import RoundPlanner


@pytest.mark.parametrize(
    "name,knobs,field",
    [
        ("sync", {"prompts": 0}, "prompts"),
        ("sync", {"samples": 0}, "samples"),
        ("tail", {"max_tokens": 0}, "max_tokens"),
        ("tail", {"eta_prompts": 0.9}, "eta_prompts"),
        ("tail", {"eta_responses": 0.5}, "eta_responses"),
        ("sorted", {"group_batches": 0}, "group_batches"),
        ("sorted", {"capacity": 0}, "capacity"),
        ("partial", {"eta_prompts": 0.99}, "eta_prompts"),
        ("tail", {"long_round_at": 1}, "long_round_at"),
    ],
)
def test_policy_fields_are_validated(name, knobs, field):
    base = {"prompts": 4, "samples": 2, "max_tokens": 64} | knobs
    with pytest.raises(ConfigError, match=field):
        make_policy(name, **base)


def test_unknown_policy_and_knob_name_the_choices():
    with pytest.raises(ConfigError, match="unknown policy 'fast'.*sync, tail, sorted, partial"):
        make_policy("fast", prompts=1, samples=1, max_tokens=1)
    with pytest.raises(ConfigError, match="no knob 'eta'"):
        make_policy("tail", prompts=1, samples=1, max_tokens=1, eta=2)
    assert policy_knobs("tail")["eta_prompts"] == 1.25 and policy_knobs("tail")["eta_responses"] == 1.25


def test_more_prompts_per_step_than_the_dataset_is_refused():
    with pytest.raises(ConfigError, match=r"prompts \(P=10\) is larger than the dataset \(5 prompts\)"):
        Scheduler(make_policy("sync", prompts=10, samples=2, max_tokens=8), num_prompts=5)


def _started(policy_name="sync"):
    planner = RoundPlanner(make_policy(policy_name, prompts=2, samples=2, max_tokens=16))
    state, commands = planner.begin_round(planner.initial(4))
    launches = [c for c in commands if isinstance(c, LaunchRequest)]
    return planner, state, launches


def test_events_for_unknown_or_finished_requests_are_refused():
    planner, state, launches = _started()
    with pytest.raises(SchedulerMisuse, match="rp000000000099 is not running"):
        planner.handle(state, RequestFinished("rp000000000099", 3, "stop"))
    with pytest.raises(SchedulerMisuse, match="not one of ours"):
        planner.handle(state, RequestFinished("req-1", 3, "stop"))
    rid = launches[0].request_id
    state, _ = planner.handle(state, RequestFinished(rid, 3, "stop"))
    with pytest.raises(SchedulerMisuse, match=f"{rid} is not running"):  # a duplicate answer
        planner.handle(state, RequestAborted(rid, 3))


def test_request_ids_are_unique_fixed_width_and_prefix_free():
    planner, state, launches = _started("tail")
    ids = [c.request_id for c in launches]
    assert len(set(ids)) == len(ids) and len({len(i) for i in ids}) == 1
    assert not any(a != b and b.startswith(a) for a in ids for b in ids)


def test_begin_round_twice_is_refused():
    planner, state, _ = _started()
    with pytest.raises(SchedulerMisuse, match="still open"):
        planner.begin_round(state)


def test_bad_event_fields_are_refused():
    with pytest.raises(ValueError):
        RequestFinished("rp000000000001", -1, "stop")
    with pytest.raises(ValueError):
        RequestFinished("rp000000000001", 1, "abort")  # an abort is RequestAborted


def test_a_pool_checkpoint_in_the_old_key_format_is_one_clear_error():
    sched = Scheduler(make_policy("tail", prompts=2, samples=2, max_tokens=16), num_prompts=8, seed=0)
    sched.begin_round()
    data = sched.to_dict()
    pool = data["planner"]["pool"] if "planner" in data else data["pool"]
    pool["returned"] = [[0, 3]]  # a prompt key as older versions saved it: [epoch, index]
    with pytest.raises(ConfigError, match="older rollpacker"):
        Scheduler(make_policy("tail", prompts=2, samples=2, max_tokens=16), num_prompts=8, seed=0, checkpoint=data)
