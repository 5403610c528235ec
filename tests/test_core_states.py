"""The core's states as data (core/states.py): every move the planner and the batcher take is in the
one transition table and tells what happened to each request; a request we aborted is never scored
unless its group is trained; a release that forgets keys is caught by the exactly-once check."""

from __future__ import annotations

import enum
from collections import defaultdict

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import RandomBackend, check_trained_exactly_once
from rollpacker.core import (
    AbortRequest,
    LaunchRequest,
    RequestFinished,
    RewardScored,
    Scheduler,
    SchedulerMisuse,
    ScoreSample,
    TrainMicroBatch,
    make_policy,
)
from rollpacker.core.records import request_id, request_number
from rollpacker.core import planner, states, stream_batcher
from rollpacker.core.prompt_pool import PromptPool
from rollpacker.core.states import (
    TRANSITIONS,
    GroupState,
    PromptStatus,
    RequestState,
    RewardStatus,
    RoundPhase,
    transition,
)

VARIANTS = [
    ("sync", {}),
    ("tail", {}),
    ("tail", {"defer_at": 0.5}),
    ("sorted", {}),
    ("sorted", {"mode": "partial", "staleness": 1}),
    ("partial", {"staleness": 0}),
    ("partial", {"staleness": 1}),
]
IDS = [f"{n}{k}" for n, k in VARIANTS]

runs = st.fixed_dictionaries(
    {
        "prompts": st.integers(1, 5),
        "samples": st.integers(1, 4),
        "extra_prompts": st.integers(0, 12),
        "max_tokens": st.integers(8, 400),
        "seed": st.integers(0, 10_000),
        "steps": st.integers(1, 6),
        "fail_rate": st.sampled_from([0.0, 0.05]),
    }
)


def backend_for(name, knobs, run, cls=RandomBackend):
    policy = make_policy(name, prompts=run["prompts"], samples=run["samples"], max_tokens=run["max_tokens"], **knobs)
    sched = Scheduler(policy, num_prompts=run["prompts"] + run["extra_prompts"], seed=run["seed"])
    return policy, cls(sched, seed=run["seed"], max_tokens=run["max_tokens"], engine_fail_rate=run["fail_rate"])


# -- the table -------------------------------------------------------------------------------------

def test_the_table_covers_every_state_and_starts_each_machine_once():
    members = {m for machine in (RequestState, GroupState, RoundPhase, PromptStatus, RewardStatus) for m in machine}
    assert set(TRANSITIONS) == members
    assert all(set(targets) <= members and all(type(t) is type(s) for t in targets) for s, targets in TRANSITIONS.items())
    assert [type(s) for s in states.INITIAL] == [RequestState, GroupState, RoundPhase, PromptStatus, RewardStatus]
    # every state is reachable from its machine's initial state
    for start in states.INITIAL:
        seen, frontier = {start}, [start]
        while frontier:
            for nxt in TRANSITIONS[frontier.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        assert seen == set(type(start))


def test_a_move_not_in_the_table_is_scheduler_misuse_naming_the_subject():
    assert transition(RequestState.RUNNING, RequestState.ABORTING, 7) is RequestState.ABORTING
    with pytest.raises(SchedulerMisuse, match="request rp000000000007 from FINISHED to ABORTING"):
        transition(RequestState.FINISHED, RequestState.ABORTING, 7)
    with pytest.raises(SchedulerMisuse, match="round of step 3 from OPEN to ENDED"):
        transition(RoundPhase.OPEN, RoundPhase.ENDED, "of step 3")


def test_the_pool_refuses_a_move_the_table_lacks():
    pool, keys = PromptPool(num_prompts=4).take(2)
    pool = pool.complete(keys[:1])
    with pytest.raises(SchedulerMisuse, match=f"prompt {keys[0]} from COMPLETED to FRESH"):
        pool.release(keys[:1])
    with pytest.raises(SchedulerMisuse, match="from FRESH to DEFERRED"):
        pool.defer([k for k in (PromptPool(num_prompts=4).take(4)[1]) if k not in keys][:1])
    with pytest.raises(SchedulerMisuse, match="twice"):
        pool.defer(keys[1:] * 2)


def test_a_second_reward_for_a_sample_is_refused_by_the_table():
    sched = Scheduler(make_policy("sync", prompts=1, samples=2, max_tokens=50), num_prompts=1)
    launches = [c for c in sched.begin_round() if isinstance(c, LaunchRequest)]
    sched.handle(RequestFinished(launches[0].request_id, 5, "stop"))
    sched.handle(RewardScored(launches[0].request_id, 1.0))
    with pytest.raises(SchedulerMisuse, match="reward of rp000000000000 from SCORED to SCORED"):
        sched.handle(RewardScored(launches[0].request_id, 0.0))


# -- properties over random runs -------------------------------------------------------------------

def recording(moves: list):
    def record(current: enum.Enum, new: enum.Enum, subject: object) -> enum.Enum:
        moves.append((current, new, subject))
        return transition(current, new, subject)
    return record


@pytest.mark.parametrize("name,knobs", VARIANTS, ids=IDS)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=runs)
def test_every_transition_taken_is_in_the_table_and_tells_what_happened(name, knobs, run):
    moves: list = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(planner, "transition", recording(moves))
        mp.setattr(stream_batcher, "transition", recording(moves))
        policy, backend = backend_for(name, knobs, run)
        for _ in range(run["steps"]):
            backend.run_step()
    assert all(new in TRANSITIONS[current] for current, new, _ in moves)

    # every launched request took a path from RUNNING to a final state, and that state is its fate
    paths = defaultdict(list)
    for current, new, subject in moves:
        if type(current) is RequestState:
            paths[subject].append((current, new))
    assert set(paths) == {request_number(c.request_id) for c in backend.launches}
    for number, path in paths.items():
        assert path[0][0] is RequestState.RUNNING
        assert all(a[1] is b[0] for a, b in zip(path, path[1:]))
        final = path[-1][1]
        assert not TRANSITIONS[final]
        rid = request_id(number)
        if rid in backend.aborts_sent:
            assert final is RequestState.ABORTED
        else:
            assert final is (RequestState.DROPPED if rid in backend.aborted_answers else RequestState.FINISHED)

    rounds = [(c, n) for c, n, _ in moves if type(c) is RoundPhase]
    assert rounds == [(RoundPhase.OPEN, RoundPhase.CLOSING), (RoundPhase.CLOSING, RoundPhase.ENDED)] * run["steps"]
    completed = [s for c, n, s in moves if n is GroupState.COMPLETE]
    assert sorted(completed) == sorted(k for e in backend.round_ends for k in e.trained)
    rewards = [(n, s) for c, n, s in moves if type(c) is RewardStatus and n in (RewardStatus.SCORED, RewardStatus.DROPPED)]
    assert sorted(s for _, s in rewards) == sorted(backend.rewarded)


class ScoringBackend(RandomBackend):
    """Notes every sample the core asks to score whose request had been sent AbortRequest."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.scored_aborted: list[str] = []
        self.trained: set[str] = set()

    def observe(self, notice) -> None:
        if isinstance(notice, ScoreSample) and notice.sample.request_id in self.aborts_sent:
            self.scored_aborted.append(notice.sample.request_id)
        super().observe(notice)

    def train(self, command: TrainMicroBatch) -> None:
        self.trained |= {r.sample.request_id for r in command.samples}
        super().train(command)


@pytest.mark.parametrize("name,knobs", VARIANTS, ids=IDS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=runs)
def test_an_aborted_request_is_never_scored_unless_its_group_trains(name, knobs, run):
    """A request we aborted is never scored by an on-policy planner.  One that carries unfinished
    work keeps a late finish unscored and scores it when its group completes: a scoring is never
    spent on a sample that is then dropped (as stale, with staleness 0 always)."""
    policy, backend = backend_for(name, knobs, run, ScoringBackend)
    for _ in range(run["steps"]):
        backend.run_step()
    if not policy.carries:
        assert not backend.scored_aborted
    wasted = [rid for rid in backend.scored_aborted if rid not in backend.trained]
    assert not wasted, f"{len(wasted)} aborted requests scored and not trained, e.g. {wasted[0]}"
    assert len(backend.scored_aborted) == len(set(backend.scored_aborted))


def test_a_late_finish_of_an_aborted_request_is_carried_unscored_then_scored_with_its_group():
    """Partial, P=1 R=2, 2 prompts over-launched: the round closes when one group completes, the
    other group's request finishes after our abort.  It is not scored in that round; the next round
    completes its group and scores it then, just before CloseGroup."""
    sched = Scheduler(make_policy("partial", prompts=1, samples=2, max_tokens=100, eta_prompts=2.0), num_prompts=4)
    launches = [c for c in sched.begin_round() if isinstance(c, LaunchRequest)]
    first = [c for c in launches if c.prompt == launches[0].prompt]
    other = [c for c in launches if c.prompt != launches[0].prompt]
    out = sched.handle(RequestFinished(other[0].request_id, 7, "stop"))  # scored: its request was running
    out += sched.handle(RequestFinished(first[0].request_id, 5, "stop"))
    out += sched.handle(RequestFinished(first[1].request_id, 6, "stop"))  # group 1 complete: the round closes
    assert AbortRequest(other[1].request_id) in out
    late = sched.handle(RequestFinished(other[1].request_id, 9, "stop"))  # answered after our abort
    assert not [c for c in late if isinstance(c, ScoreSample)]
    for c in (other[0], *first):
        sched.handle(RewardScored(c.request_id, 1.0))
    assert sched.step_done
    opened = sched.begin_round()
    kinds = [type(c).__name__ for c in opened]
    scored = [c.sample.request_id for c in opened if isinstance(c, ScoreSample)]
    assert scored == [other[1].request_id]  # scored now, with its group, before it closes
    assert kinds.index("ScoreSample") < kinds.index("CloseGroup")


# -- exactly once per epoch, launched or not -------------------------------------------------------

def run_tail_predict(seed: int) -> tuple[Scheduler, list]:
    """Tail with prediction over 6 prompts, P=2: a draw that fills the long queue releases the keys
    drawn so far (PromptPool.release), so some keys go back without being launched."""
    sched = Scheduler(make_policy("tail", prompts=2, samples=2, max_tokens=300, predict=True), num_prompts=6, seed=seed)
    backend = RandomBackend(sched, seed=seed, max_tokens=300)
    for _ in range(12):
        backend.run_step()
    return sched, [k for e in backend.round_ends for k in e.trained]


def test_exactly_once_check_catches_a_release_that_forgets_keys(monkeypatch):
    released = []
    real = PromptPool.release

    def counting(self, keys):
        keys = tuple(keys)
        released.extend(keys)
        return real(self, keys)

    monkeypatch.setattr(PromptPool, "release", counting)
    sched, trained = run_tail_predict(seed=2)
    assert released  # the scenario releases keys
    check_trained_exactly_once(sched.state.pool, trained)

    def forgetting(self, keys):  # leaves the in-flight set without going back to `returned`
        return attrs.evolve(self, in_flight=self._leave(tuple(keys), "release"))

    monkeypatch.setattr(PromptPool, "release", forgetting)
    sched, trained = run_tail_predict(seed=2)
    with pytest.raises(AssertionError, match="lost"):
        check_trained_exactly_once(sched.state.pool, trained)
