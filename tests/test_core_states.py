"""The core's states as data (core/states.py): every move the planner and the batcher take is in the
one transition table and tells what happened to each request; a request we aborted is never scored
unless its group is trained; a release that forgets keys is caught by the exactly-once check."""

from __future__ import annotations

import enum
import itertools
from collections import defaultdict

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import RandomBackend, check_trained_exactly_once
from rollpacker.core import (
    AbortRequest,
    EndRound,
    RequestAborted,
    LaunchRequest,
    RequestFinished,
    RewardConfig,
    RewardScored,
    Scheduler,
    SchedulerMisuse,
    ScoreSample,
    TrainMicroBatch,
    make_policy,
)
from rollpacker.core.records import request_id, request_number
from rollpacker.core import draft, planner, prompt_pool, states, stream_batcher
from rollpacker.core.prompt_pool import PromptPool
from rollpacker.core.states import (
    TRANSITIONS,
    GroupState,
    Move,
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
    machines = (RequestState, GroupState, RoundPhase, PromptStatus, RewardStatus)
    members = {m for machine in machines for m in machine}
    assert {s for s, _ in TRANSITIONS} | set(TRANSITIONS.values()) == members
    assert all(type(new) is type(state) for (state, _), new in TRANSITIONS.items())
    assert all(isinstance(t, Move) or (isinstance(t, type) and t.__module__.startswith("rollpacker.core."))
               for _, t in TRANSITIONS)
    assert [type(s) for s in states.INITIAL] == list(machines)
    # every state is reachable from its machine's initial state
    for start in states.INITIAL:
        seen, frontier = {start}, [start]
        while frontier:
            current = frontier.pop()
            for (state, _), nxt in TRANSITIONS.items():
                if state is current and nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        assert seen == set(type(start))


def test_the_next_state_is_looked_up_by_state_and_trigger():
    """One trigger, two outcomes by the state it meets: a finish of a running request keeps it, a
    finish after our abort does not; a reward is scored, or dropped once its step ended."""
    assert transition(RequestState.RUNNING, RequestFinished, 7) is RequestState.FINISHED
    assert transition(RequestState.ABORTING, RequestFinished, 7) is RequestState.ABORTED
    assert transition(RequestState.RUNNING, RequestAborted, 7) is RequestState.DROPPED
    assert transition(RequestState.ABORTING, RequestAborted, 7) is RequestState.ABORTED
    assert transition(RewardStatus.AWAITING, RewardScored, "r") is RewardStatus.SCORED
    assert transition(RewardStatus.DISCARDED, RewardScored, "r") is RewardStatus.DROPPED


def test_a_move_not_in_the_table_is_scheduler_misuse_naming_the_subject():
    assert transition(RequestState.RUNNING, AbortRequest, 7) is RequestState.ABORTING
    with pytest.raises(SchedulerMisuse, match="request rp000000000007 from FINISHED on AbortRequest"):
        transition(RequestState.FINISHED, AbortRequest, 7)
    with pytest.raises(SchedulerMisuse, match=r"round of step 3 from OPEN on EndRound \(allowed from OPEN: CLOSE\)"):
        transition(RoundPhase.OPEN, EndRound, "of step 3")


def test_the_pool_refuses_a_move_the_table_lacks():
    pool, keys = PromptPool(num_prompts=4).take(2)
    pool = pool.complete(keys[:1])
    with pytest.raises(SchedulerMisuse, match=f"prompt {keys[0]} from COMPLETED on RELEASE"):
        pool.release(keys[:1])
    with pytest.raises(SchedulerMisuse, match="from FRESH on DEFER"):
        pool.defer([k for k in (PromptPool(num_prompts=4).take(4)[1]) if k not in keys][:1])
    with pytest.raises(SchedulerMisuse, match="twice"):
        pool.defer(keys[1:] * 2)


def test_a_second_reward_for_a_sample_is_refused_by_the_table():
    sched = Scheduler(make_policy("sync", prompts=1, samples=2, max_tokens=50), num_prompts=1)
    launches = [c for c in sched.begin_round() if isinstance(c, LaunchRequest)]
    sched.handle(RequestFinished(launches[0].request_id, 5, "stop"))
    sched.handle(RewardScored(launches[0].request_id, 1.0))
    with pytest.raises(SchedulerMisuse, match="reward of rp000000000000 from SCORED on RewardScored"):
        sched.handle(RewardScored(launches[0].request_id, 0.0))


def test_a_long_round_opens_when_the_long_queue_holds_exactly_p_prompts():
    """RollPacker's trigger: P deferred prompts make the next round a long one that plays them;
    P - 1 do not (a short round draws fresh prompts)."""
    P = 3
    policy = make_policy("tail", prompts=P, samples=2, max_tokens=50)
    for queued, kind in ((P, "long"), (P - 1, "short")):
        sched = Scheduler(policy, num_prompts=12)
        pool, keys = sched.state.pool.take(queued)
        sched.state = attrs.evolve(sched.state, pool=pool.defer(keys))
        launches = [c for c in sched.begin_round() if isinstance(c, LaunchRequest)]
        assert sched.state.round.kind == kind
        played = {c.prompt for c in launches}
        assert (played == set(keys)) if kind == "long" else not (played & set(keys))


# -- properties over random runs -------------------------------------------------------------------

def recording(moves: list):
    def record(current: enum.Enum, trigger, subject: object) -> enum.Enum:
        new = transition(current, trigger, subject)
        moves.append((current, new, subject, trigger))
        return new
    return record


def recorded(moves: list):
    """Every module that moves a machine, its `transition` recording into `moves`."""
    mp = pytest.MonkeyPatch()
    for module in (planner, draft, stream_batcher, prompt_pool):
        mp.setattr(module, "transition", recording(moves))
    return mp


@pytest.mark.parametrize("name,knobs", VARIANTS, ids=IDS)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=runs)
def test_every_transition_taken_is_in_the_table_and_tells_what_happened(name, knobs, run):
    moves: list = []
    mp = recorded(moves)
    try:
        policy, backend = backend_for(name, knobs, run)
        for _ in range(run["steps"]):
            backend.run_step()
    finally:
        mp.undo()
    assert all(TRANSITIONS[(current, trigger)] is new for current, new, _, trigger in moves)
    moves = [m[:3] for m in moves]

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
        assert not [edge for edge in TRANSITIONS if edge[0] is final]  # a final state
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


def test_every_edge_of_the_table_is_taken_by_some_run_of_the_harness():
    """The table holds no edge the code never takes: a fixed sweep of random runs takes them all
    (every policy; engine drops; prompts predicted long; live groups deferred; one scorer, so the
    samples of open groups still wait when the step ends and their late rewards are dropped; a
    crash mid-step restored from its checkpoint, its prompts recovered)."""
    moves: list = []
    mp = recorded(moves)
    try:
        for (name, knobs), seed in itertools.product(VARIANTS + [("tail", {"predict": True})], range(3)):
            max_tokens = (300, 30, 10)[seed]  # (short answers: the scorer is the bottleneck)
            policy = make_policy(name, prompts=8, samples=2, max_tokens=max_tokens, **knobs)
            sched = Scheduler(policy, num_prompts=32, seed=seed, rewards=RewardConfig(workers=1 + seed % 2))
            backend = RandomBackend(sched, seed=seed, max_tokens=max_tokens, engine_fail_rate=0.05)
            for _ in range(4):
                backend.run_step()
            backend.run_step(stop_after_events=5)  # a crash mid-step
            Scheduler(policy, num_prompts=32, checkpoint=sched.to_dict())
    finally:
        mp.undo()
    taken = {(current, trigger) for current, _, _, trigger in moves}
    missing = set(TRANSITIONS) - taken
    assert not missing, f"edges no run takes: {sorted(f'{s.name} on {states._name(t)}' for s, t in missing)}"


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
        return attrs.evolve(self, in_flight=self._leave(tuple(keys), Move.RELEASE))

    monkeypatch.setattr(PromptPool, "release", forgetting)
    sched, trained = run_tail_predict(seed=2)
    with pytest.raises(AssertionError, match="lost"):
        check_trained_exactly_once(sched.state.pool, trained)
