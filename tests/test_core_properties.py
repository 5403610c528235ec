"""Properties of the planner + batcher over random datasets, lengths and event orders, for every
policy: exactly-once training per epoch (also across checkpoint/restore at any point), exact step
sizes, on-policy guarantees, staleness bounds, token accounting."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import RandomBackend, check_trained_exactly_once
from rollpacker.core import (
    BatcherConfig,
    CloseGroup,
    EndRound,
    LaunchRequest,
    RequestFinished,
    RewardScored,
    Scheduler,
    StepOptimizer,
    TrainMicroBatch,
    make_policy,
)
from rollpacker.core.prompt_pool import COMPLETED
from rollpacker.core.records import SEED_RANGE, request_number, sampling_seed

POLICY_VARIANTS = [
    ("sync", {}),
    ("tail", {}),
    ("tail", {"eta_responses": 1.0}),
    ("tail", {"predict": True}),
    ("tail", {"eta_prompts": 1.5, "eta_responses": 1.5}),
    ("tail", {"longest_first": True, "defer_at": 0.5}),
    ("tail", {"defer_at": 1.0, "eta_responses": 1.0}),
    ("sorted", {}),
    ("sorted", {"prefetch": False}),
    ("sorted", {"longest_first": True}),
    ("sorted", {"mode": "partial", "longest_first": True}),
    ("sorted", {"mode": "partial", "staleness": 1}),
    ("sorted", {"mode": "partial", "staleness": 2, "group_batches": 2}),
    ("partial", {"staleness": 1}),
    ("partial", {"staleness": 0}),
]
ON_POLICY = {("sync", False), ("tail", False), ("sorted", False)}

runs = st.fixed_dictionaries(
    {
        "prompts": st.integers(1, 6),
        "samples": st.integers(1, 4),
        "extra_prompts": st.integers(0, 20),
        "max_tokens": st.integers(8, 600),
        "seed": st.integers(0, 10_000),
        "steps": st.integers(1, 7),
        "fail_rate": st.sampled_from([0.0, 0.0, 0.05]),
    }
)


def build(name, knobs, run):
    policy = make_policy(name, prompts=run["prompts"], samples=run["samples"], max_tokens=run["max_tokens"], **knobs)
    sched = Scheduler(policy, num_prompts=run["prompts"] + run["extra_prompts"], seed=run["seed"])
    return policy, sched


def check_no_loss(backend: RandomBackend, trained: list) -> None:
    """Every prompt ever launched is trained once, or still to be trained: in flight, deferred or
    fresh.  Fresh includes a prompt that a restore put back before the epoch's cursor (the step it
    was drawn in was never committed), not only the `returned` queue."""
    pool = backend.sched.state.pool
    assert len(trained) == len(set(trained)), "a prompt was trained twice in one epoch"
    drawn = {c.prompt for c in backend.launches}
    lost = {k for k in drawn - set(trained) if pool.status(k) == COMPLETED}
    assert not lost, f"lost prompts: {sorted(lost)[:5]}"
    pending = [k for k in trained if pool.status(k) != COMPLETED]
    assert not pending, f"a trained prompt is still pending: {pending[0]} ({pool.status(pending[0])})"
    check_trained_exactly_once(pool, trained)  # launched or not


@pytest.mark.parametrize("name,knobs", POLICY_VARIANTS, ids=[f"{n}{k}" for n, k in POLICY_VARIANTS])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=runs)
def test_every_step_trains_p_prompts_once_and_loses_none(name, knobs, run):
    policy, sched = build(name, knobs, run)
    backend = RandomBackend(sched, seed=run["seed"], max_tokens=run["max_tokens"], engine_fail_rate=run["fail_rate"])
    for _ in range(run["steps"]):
        backend.run_step()
    ends = backend.round_ends
    assert [len(e.trained) for e in ends] == [run["prompts"]] * run["steps"]
    assert [o.num_samples for o in backend.opt_steps] == [run["prompts"] * run["samples"]] * run["steps"]
    trained = [k for e in ends for k in e.trained]
    check_no_loss(backend, trained)

    # a request answered by an abort never ends a trained sample; on-policy, it is not in one at all
    for mb in backend.micro_batches:
        for ref in mb.samples:
            assert ref.sample.request_id not in backend.aborted_answers or ref.sample.finish_reason == "length"
            if not policy.carries:
                assert not {s.request_id for s in ref.sample.segments} & backend.aborted_answers
    for o, e in zip(backend.opt_steps, ends):
        assert o.step == e.step

    is_on_policy = (name, policy.carries) in ON_POLICY
    for mb in backend.micro_batches:
        for ref in mb.samples:
            lag = ref.sample.staleness(mb.step)
            assert 0 <= lag <= policy.max_staleness
            if is_on_policy:
                assert len(ref.sample.segments) == 1 and ref.sample.segments[0].policy_version == mb.step
    if is_on_policy:
        assert all(e.report.offpolicy_tokens == 0 for e in ends)


@given(run_seed=st.integers(0, SEED_RANGE - 1), other=st.integers(0, SEED_RANGE - 1),
       numbers=st.sets(st.integers(0, SEED_RANGE - 1), min_size=1, max_size=50))
def test_sampling_seeds_are_distinct_within_a_run_and_move_with_the_run_seed(run_seed, other, numbers):
    """Any of a run's first 2**31 requests: seeds in the engines' range, no two alike."""
    seeds = [sampling_seed(run_seed, n) for n in numbers]
    assert all(0 <= x < SEED_RANGE for x in seeds)
    assert len(set(seeds)) == len(seeds)
    if other != run_seed:  # another run seed changes every request's seed
        assert all(sampling_seed(other, n) != x for n, x in zip(numbers, seeds))


@pytest.mark.parametrize("name,knobs", POLICY_VARIANTS, ids=[f"{n}{k}" for n, k in POLICY_VARIANTS])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=runs)
def test_every_launch_carries_its_own_seed_fixed_by_the_run_seed(name, knobs, run):
    """The core decides each request's sampling seed: distinct across the run's requests (a group's
    R samples, a resumed request's segments included), the same when the run is played again."""
    def launches() -> list[LaunchRequest]:
        _, sched = build(name, knobs, run)
        backend = RandomBackend(sched, seed=run["seed"], max_tokens=run["max_tokens"], engine_fail_rate=run["fail_rate"])
        for _ in range(run["steps"]):
            backend.run_step()
        return backend.launches

    first = launches()
    seeds = [c.seed for c in first]
    assert len(set(seeds)) == len(seeds), "two requests of the run share a sampling seed"
    groups: dict = {}
    for c in first:
        groups.setdefault((c.prompt, c.policy_version), []).append(c.seed)
    assert all(len(set(g)) == len(g) for g in groups.values()), "a group's samples share a seed"
    assert seeds == [sampling_seed(run["seed"], request_number(c.request_id)) for c in first]
    assert [(c.request_id, c.seed) for c in launches()] == [(c.request_id, c.seed) for c in first]


@pytest.mark.parametrize("name,knobs", POLICY_VARIANTS, ids=[f"{n}{k}" for n, k in POLICY_VARIANTS])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=runs)
def test_token_accounting_balances(name, knobs, run):
    """generated + carried in == kept + wasted + carried out, summed over rounds."""
    policy, sched = build(name, knobs, run)
    backend = RandomBackend(sched, seed=run["seed"], max_tokens=run["max_tokens"], engine_fail_rate=run["fail_rate"])
    for _ in range(run["steps"]):
        backend.run_step()
    reports = [e.report for e in backend.round_ends]
    generated = sum(r.generated_tokens for r in reports)
    kept = sum(r.kept_tokens for r in reports)
    wasted = sum(r.wasted_tokens for r in reports)
    assert generated == kept + wasted + reports[-1].carried_tokens
    assert sum(o.num_tokens for o in backend.opt_steps) == kept
    if not policy.carries:
        assert all(r.carried_tokens == 0 for r in reports)


@pytest.mark.parametrize("name,knobs", POLICY_VARIANTS, ids=[f"{n}{k}" for n, k in POLICY_VARIANTS])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=runs, crash_after=st.integers(0, 60), crash_step=st.integers(0, 4))
def test_checkpoint_restore_at_any_point_keeps_exactly_once(name, knobs, run, crash_after, crash_step):
    policy, sched = build(name, knobs, run)
    backend = RandomBackend(sched, seed=run["seed"], max_tokens=run["max_tokens"])
    trained = []
    for _ in range(crash_step):
        backend.run_step()
    trained += [k for e in backend.round_ends for k in e.trained]
    finished = backend.run_step(stop_after_events=crash_after)
    if finished:
        trained += list(backend.round_ends[-1].trained)
    checkpoint = sched.to_dict()
    restored = Scheduler(policy, num_prompts=sched.state.pool.num_prompts, checkpoint=checkpoint)
    assert restored.state.next_request == sched.state.next_request  # ids are never reused
    backend2 = RandomBackend(restored, seed=run["seed"] + 1, max_tokens=run["max_tokens"],
                           prompt_effect=backend.prompt_effect)
    for _ in range(run["steps"]):
        backend2.run_step()
    trained += [k for e in backend2.round_ends for k in e.trained]
    launched_ids = {c.request_id for c in backend.launches}
    assert not launched_ids & {c.request_id for c in backend2.launches}
    backend2.launches = backend.launches + backend2.launches
    check_no_loss(backend2, trained)


class StreamingBackend(RandomBackend):
    """Checks, after the commands of every event (at each wait), that trainable samples are not held
    back: once a group is complete and all its rewards are in, its samples go to the trainer as soon
    as they fill a micro-batch, long before the optimizer step."""

    def __init__(self, *args, token_budget: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.budget = token_budget
        self.completed: list = []  # the samples of each group completed this step
        self.sent: set[str] = set()

    def observe(self, notice) -> None:
        super().observe(notice)
        if isinstance(notice, CloseGroup):
            self.completed.append(notice.samples)

    def train(self, command) -> None:
        super().train(command)
        self.sent |= {r.sample.request_id for r in command.samples}

    def step_optimizer(self, command) -> None:
        super().step_optimizer(command)
        self.completed, self.sent = [], set()

    def wait(self) -> list:
        ready = [s for group in self.completed if all(s.request_id in self.rewarded for s in group) for s in group]
        held = [s for s in ready if s.request_id not in self.sent]
        assert len(held) <= 1 or sum(s.num_tokens for s in held) <= self.budget, (
            f"{len(held)} trainable samples ({sum(s.num_tokens for s in held)} tokens) held back, "
            f"token budget {self.budget}"
        )
        return super().wait()


@pytest.mark.parametrize("name,knobs", [("sync", {}), ("tail", {}), ("sorted", {}), ("partial", {"staleness": 1})])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=runs, budget=st.integers(1, 300))
def test_micro_batches_stream_before_the_optimizer_step(name, knobs, run, budget):
    """Stream training: a micro-batch leaves as soon as ready samples fill it, not at the step's end."""
    policy = make_policy(name, prompts=run["prompts"], samples=run["samples"], max_tokens=run["max_tokens"], **knobs)
    sched = Scheduler(policy, num_prompts=run["prompts"] + run["extra_prompts"], seed=run["seed"],
                      batcher=BatcherConfig(token_budget=budget))
    backend = StreamingBackend(sched, seed=run["seed"], max_tokens=run["max_tokens"], token_budget=budget,
                             engine_fail_rate=run["fail_rate"])
    for _ in range(run["steps"]):
        backend.run_step()


def test_a_finished_group_trains_while_the_round_still_runs():
    """Sync P=2 R=2 with a 1-token budget: the first group, finished and scored, is trained while
    the other group still generates (no EndRound yet)."""
    sched = Scheduler(make_policy("sync", prompts=2, samples=2, max_tokens=100), num_prompts=2,
                      batcher=BatcherConfig(token_budget=1))
    launches = [c for c in sched.begin_round() if isinstance(c, LaunchRequest)]
    first = [c for c in launches if c.prompt == launches[0].prompt]
    out = []
    for c in first:
        out += sched.handle(RequestFinished(c.request_id, 10, "stop"))
    for c in first:
        out += sched.handle(RewardScored(c.request_id, 1.0))
    assert [type(c) for c in out if isinstance(c, (TrainMicroBatch, EndRound, StepOptimizer))] == [TrainMicroBatch]
    assert not sched.step_done


@settings(max_examples=30, deadline=None)
@given(run=runs)
def test_tail_long_rounds_never_over_launch_nor_abort(run):
    policy, sched = build("tail", {}, run)
    backend = RandomBackend(sched, seed=run["seed"], max_tokens=run["max_tokens"])
    for _ in range(run["steps"] + 4):
        backend.run_step()
    for end in backend.round_ends:
        if end.kind == "long":
            assert end.report.launched_requests == run["prompts"] * run["samples"]
            assert end.report.wasted_tokens == 0
    long_launches = [c for c in backend.launches if c.max_new_tokens != run["max_tokens"]]
    assert not long_launches


@settings(max_examples=30, deadline=None)
@given(run=runs)
def test_unbiased_tail_keeps_whole_groups(run):
    """eta_responses=1.0: every trained group is all R of its launched samples."""
    policy, sched = build("tail", {"eta_responses": 1.0}, run)
    backend = RandomBackend(sched, seed=run["seed"], max_tokens=run["max_tokens"])
    for _ in range(run["steps"]):
        backend.run_step()
    groups: dict = {}
    for mb in backend.micro_batches:
        for ref in mb.samples:
            groups.setdefault((mb.step, ref.sample.prompt), []).append(ref.sample.sample_index)
    assert len(groups) == run["prompts"] * run["steps"]
    for indices in groups.values():  # all R launched samples of the group, each once
        assert sorted(indices) == list(range(run["samples"]))


def test_tail_plays_short_then_long_rounds():
    policy, sched = build("tail", {}, {"prompts": 8, "samples": 4, "extra_prompts": 200, "max_tokens": 4000, "seed": 3})
    backend = RandomBackend(sched, seed=3, max_tokens=4000)
    for _ in range(12):
        backend.run_step()
    kinds = [e.kind for e in backend.round_ends]
    assert "long" in kinds and kinds.count("short") >= 3 * kinds.count("long")
    first_long = kinds.index("long")
    # a long round trains prompts that a short round deferred
    deferred = {k for e in backend.round_ends[:first_long] for k in e.trained}
    assert not deferred & set(backend.round_ends[first_long].trained)


def test_engine_failures_are_retried_not_lost():
    policy, sched = build("sync", {}, {"prompts": 4, "samples": 4, "extra_prompts": 0, "max_tokens": 100, "seed": 1})
    backend = RandomBackend(sched, seed=5, max_tokens=100, engine_fail_rate=0.3)
    backend.run_step()
    assert backend.round_ends[0].report.retried_requests > 0
    assert backend.opt_steps[0].num_samples == 16
