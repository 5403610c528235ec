"""One step record for live runs and the simulator: `core.step_record` derives every timing field
from one `StepTimes` (a step's marks and its trainer's spans), the fields add up to the step for any
timeline, and the live backend's `StepLog` and the simulator's `StepMeter` give the same record for
the same timeline."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollpacker.core import EndRound, Occupancy, RewardScored, RoundReport, StepTimes, bubble_ratio, step_record
from rollpacker.core.metrics import split_training, step_timings
from rollpacker.driver.step_log import StepLog
from rollpacker.driver.train_worker import OPTIMIZER_STEP, TrainerRan
from rollpacker.sim.metrics import StepMeter

TIMINGS = ("rollout_s", "reward_s", "train_s", "train_overlapped_s", "train_exposed_s", "sync_s", "step_s",
           "tp_switch_s")
REPORT = RoundReport(step=3, kind="short", launched_requests=4, generated_tokens=40, kept_tokens=30,
                     wasted_tokens=10, carried_tokens=0, offpolicy_tokens=0, staleness=((0, 30),),
                     trained_prompts=2, deferred_prompts=0, returned_prompts=0, mean_kept_length=15.0,
                     mean_generated_length=10.0)

seconds = st.floats(0.0, 50.0, allow_nan=False)


@st.composite
def timelines(draw):
    """A step's marks and trainer spans in any valid order: training may start during the rollout,
    run under the reward wait, or only after it; rewards may all be in before the round ends."""
    start = draw(st.floats(0.0, 1e4, allow_nan=False))
    tp_switch = draw(st.one_of(st.just(0.0), seconds))
    round_end = start + tp_switch + draw(seconds)
    rewards_done = start + draw(st.floats(0.0, 150.0, allow_nan=False))
    spans, at = [], start + tp_switch
    for gap, length in draw(st.lists(st.tuples(seconds, seconds), max_size=6)):
        spans.append((at + gap, at + gap + length))
        at = at + gap + length
    # the optimizer step: after every micro-batch and the last reward
    optimizer_start = max(at, rewards_done, round_end) + draw(seconds)
    train_done = optimizer_start + draw(seconds)
    spans.append((optimizer_start, train_done))
    sync = draw(seconds)
    times = StepTimes(start=start, round_end=round_end, rewards_done=rewards_done, end=train_done + sync,
                      tp_switch_s=tp_switch, sync_s=sync, train_spans=tuple(spans))
    occupancy, now = Occupancy(), start + tp_switch
    for gap, running in draw(st.lists(st.tuples(st.floats(0.0, 30.0, allow_nan=False), st.integers(0, 80)),
                                      max_size=30)):
        now += gap  # (changes may come after the round's end: they are outside its bubble)
        occupancy.set(now, running)
    return times, occupancy, draw(st.integers(1, 64))


@settings(max_examples=300, deadline=None)
@given(timeline=timelines())
def test_the_timing_fields_are_non_negative_and_add_up_to_the_step(timeline):
    times, occupancy, capacity = timeline
    record = step_record(REPORT, times, occupancy, capacity, extra=1)
    close = dict(rel=1e-9, abs=1e-6)
    assert all(record[k] >= 0.0 for k in TIMINGS), {k: record[k] for k in TIMINGS}
    assert record["step_s"] == pytest.approx(record["tp_switch_s"] + record["rollout_s"] + record["reward_s"]
                                             + record["train_exposed_s"] + record["sync_s"], **close)
    assert record["reward_s"] == pytest.approx(max(0.0, times.rewards_done - times.round_end), **close)
    busy = sum(b - a for a, b in times.train_spans)
    assert record["train_s"] == pytest.approx(busy, **close)
    assert record["train_overlapped_s"] <= record["train_s"] + 1e-6
    # everything the trainer ran after the last reward is exposed, and exposed is no more than
    # that plus its idle wait before the optimizer step
    reward_end = max(times.round_end, times.rewards_done)
    assert split_training(times.train_spans, reward_end)[1] <= record["train_exposed_s"] + 1e-6
    assert 0.0 <= record["bubble_ratio"] <= 1.0
    assert record["extra"] == 1 and record["kept_tokens"] == 30


def test_the_bubble_ends_with_the_round():
    """Requests that end after the round's end (an abort's late answer) are outside its bubble; counted
    past `end`, they made the ratio negative (-3/40 here)."""
    assert bubble_ratio([0.0, 1.0, 11.0, 12.0], [4, 4, 3, 2], capacity=4, end=10.0) == 0.0
    assert bubble_ratio([0.0, 5.0, 12.0], [4, 2, 0], capacity=4, end=10.0) == pytest.approx(10 / 40)


def test_step_times_out_of_order_are_one_error_naming_the_marks():
    with pytest.raises(ValueError, match="end - sync_s = 4.0 before rewards wait's end = 6.0"):
        StepTimes(start=0.0, round_end=5.0, rewards_done=6.0, end=5.0, sync_s=1.0)
    with pytest.raises(ValueError, match="round_end = 1.0 before start \\+ tp_switch_s = 2.0"):
        StepTimes(start=0.0, round_end=1.0, rewards_done=0.0, end=5.0, tp_switch_s=2.0)


class Instance:
    """What the simulator's meter reads of an instance: its running requests."""

    def __init__(self, running: int) -> None:
        self.running = [None] * running


def test_live_and_simulated_steps_give_the_same_record_for_the_same_timeline():
    """One timeline fed to the live backend's StepLog and to the simulator's StepMeter, through the
    calls each backend makes: 4 launches at 0 s, ends at 3, 5, 8 and 10 s (the round's end); a
    micro-batch trains 4-9 s (under the rollout) and 11-14 s (under the reward wait); the last
    reward comes at 13 s; the optimizer step runs 14-15 s.  Both records: rollout 10 s, reward 3 s
    (10 -> 13), exposed training 2 s (13 -> 15), train 9 s of which 5 s overlapped the rollout.
    (The live record used to call reward_s the step less rollout, training after the round and
    sync: 15 - 10 - 4 = 1 s here, with 4 s "exposed"; the simulator said 3 s and 2 s.)"""
    launches, ends, round_end, last_reward = 4, (3.0, 5.0, 8.0, 10.0), 10.0, 13.0
    spans, optimizer, end = [(4.0, 9.0), (11.0, 14.0)], (14.0, 15.0), 15.0

    live = StepLog(start=0.0)
    for _ in range(launches):
        live.occupancy.change(0.0, +1)
    for at in ends:
        live.occupancy.change(at, -1)
    live.round_end = round_end
    live.rewards_done = last_reward
    live.train_spans = [(a, b, f"micro-batch {k}") for k, (a, b) in enumerate(spans)]
    live.train_spans.append((*optimizer, "optimizer step"))
    live_record = step_record(REPORT, live.times(end), live.occupancy, capacity=4)

    meter = StepMeter(start=0.0, capacity=4)
    running = launches
    meter.occupancy(0.0, running, [Instance(running)])
    for at in ends:
        running -= 1
        meter.occupancy(at, running, [Instance(running)])
    for a, b in spans:
        meter.trained(a, b - a)
    meter.reward(RewardScored("rp000000000001", 1.0, at=7.0))
    meter.round_ended(EndRound(step=3, kind="short", trained=(), report=REPORT), round_end)
    meter.reward(RewardScored("rp000000000002", 0.0, at=last_reward))
    sim_record = step_record(REPORT, meter.times(0.0, *optimizer), meter.log, meter.capacity)

    fields = TIMINGS + ("bubble_ratio",)
    assert {k: live_record[k] for k in fields} == {k: sim_record[k] for k in fields}
    assert step_timings(live.times(end)) == {"rollout_s": 10.0, "reward_s": 3.0, "train_s": 9.0,
                                             "train_overlapped_s": 5.0, "train_exposed_s": 2.0, "sync_s": 0.0,
                                             "step_s": 15.0, "tp_switch_s": 0.0}
    # idle slots: 1 of 4 over 3-5 s, 2 over 5-8 s, 3 over 8-10 s: 2 + 6 + 6 = 14 of 40
    assert live_record["bubble_ratio"] == sim_record["bubble_ratio"] == pytest.approx(14 / 40)


def test_a_reward_answered_after_the_optimizer_step_is_no_wait_of_the_step():
    """The answer that completes the step's last group and a carried sample's answer can come in one
    poll: the driver feeds both, so the carried one is recorded after the optimizer stepped and the
    weights synced.  It must not move the step's reward wait past its training (the record used to
    fail: "end - sync_s before rewards wait's end", seen on a tail step against real servers)."""
    log = StepLog(start=0.0)
    log.round_end = 2.0
    log.reward_answered(2.3)
    assert not log.stepped
    log.trained_jobs([TrainerRan(OPTIMIZER_STEP, 2.3, 2.4, None)])  # as the live driver records the step
    assert log.stepped and log.train_spans == [(2.3, 2.4, OPTIMIZER_STEP)]
    log.sync_s = 0.1
    log.reward_answered(2.52)  # after the sync: end - sync_s = 2.445
    times = log.times(2.545)
    assert times.rewards_done == 2.3
    assert step_timings(times)["reward_s"] == pytest.approx(0.3)
    assert step_timings(times)["step_s"] == pytest.approx(2.545)
