"""The loop's step record lists every request's prompt, length, finish reason, id and reward, and a run's
metrics export into a simulator workload (fake engine, rewards and trainer: no model)."""

from __future__ import annotations

import json

from rollpacker.core import Scheduler, make_policy
from rollpacker.core.protocols import GenerationResult, RewardOutcome, TrainStats
from rollpacker.driver import StepLoop
from rollpacker.sim.workloads import export_trace, load_workload

MAX = 64


def length_of(prompt: int, seed: int) -> int:
    return min(MAX, 5 + 7 * prompt + seed % 5)


class FakeEngine:
    capacity = 64

    def __init__(self) -> None:
        self.out, self.prompt = [], {}

    def submit(self, requests) -> None:
        for r in requests:
            n = min(length_of(r.prompt_ids[0], r.seed), r.max_new_tokens)
            self.out.append(GenerationResult(r.request_id, (1,) * n, (0.0,) * n,
                                             "length" if n == r.max_new_tokens else "stop", 0, 0.0))

    def poll(self, timeout=None):
        out, self.out = self.out[:1], self.out[1:]  # one answer a poll: first ones win the group
        return out

    def abort(self, request_ids) -> None:
        gone = set(request_ids)
        self.out = [GenerationResult(o.request_id, (), (), "abort", 0, 0.0) if o.request_id in gone else o
                    for o in self.out]

    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def update_weights(self, weights, version) -> None: ...
    def close(self) -> None: ...


class FakeRewards:
    def __init__(self) -> None:
        self.jobs = []

    def submit(self, job) -> None:
        self.jobs.append(RewardOutcome(job.request_id, 1.0, "ok"))

    def poll(self, timeout=None):
        out, self.jobs = self.jobs, []
        return out

    def close(self) -> None: ...


class FakeTrainer:
    def forward_backward(self, batch) -> TrainStats:
        return TrainStats(0.0, sum(len(s.response_ids) for s in batch.samples))

    def optimizer_step(self, loss_normalizer) -> TrainStats:
        return TrainStats(0.0, 0)

    def export_weights(self):
        return {}


class FakePrompts:
    def prompt_ids(self, index: int) -> tuple[int, ...]:
        return (index, 2, 3)

    def reward_job(self, request_id, index, response_ids):
        from rollpacker.core.protocols import RewardJob
        return RewardJob(request_id, "t", index, "")


def test_step_records_hold_every_request_and_export_as_a_workload(tmp_path):
    sched = Scheduler(make_policy("tail", prompts=3, samples=2, max_tokens=MAX), num_prompts=8)
    loop = StepLoop(sched, FakeEngine(), FakeRewards(), FakeTrainer(), FakePrompts())
    records = [loop.run_step() for _ in range(3)]
    for record in records:
        launched = record["launched_requests"]
        assert len(record["requests"]) == launched  # every launched request ended and is listed
        reasons = {r for _, _, r, _, _ in record["requests"]}
        assert reasons <= {"stop", "length", "abort"} and "stop" in reasons
        ids = [rid for _, _, _, rid, _ in record["requests"]]
        assert len(set(ids)) == len(ids)
        for prompt, n, reason, _, reward in record["requests"]:
            if reason != "abort":
                assert 0 <= prompt < 8 and 5 + 7 * prompt <= n <= min(MAX, 9 + 7 * prompt)
            else:
                assert reward is None  # an aborted request is never scored
        scored = [reward for *_, reward in record["requests"] if reward is not None]
        assert scored and set(scored) == {1.0}  # FakeRewards gives every kept sample 1.0
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "trace.jsonl"
    assert export_trace(metrics, out) >= 3
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(len(line["lengths"]) == len(line["finish_reasons"]) for line in lines)
    workload = load_workload(str(out), num_prompts=len({line["prompt"] for line in lines}), seed=0, max_tokens=MAX)
    assert all(1 <= workload.sample(i, 0) <= MAX for i in range(workload.num_prompts))


def test_a_sample_scored_in_one_step_and_trained_in_the_next_keeps_its_reward():
    """Partial rollout carries a group's finished samples into the next step: their rewards, which
    arrived in the earlier step, are still there when the group trains (was a KeyError)."""
    sched = Scheduler(make_policy("partial", prompts=3, samples=2, max_tokens=MAX), num_prompts=8)
    loop = StepLoop(sched, FirstSamplesFirst(), FakeRewards(), FakeTrainer(), FakePrompts())
    records = [loop.run_step() for _ in range(4)]
    for before, after in zip(records, records[1:]):
        scored = {prompt for prompt, _, _, _, reward in before["requests"] if reward is not None}
        trained_before = {int(k.rpartition("p")[2]) for k in before["trained"]}
        carried = scored - trained_before  # a group with a scored sample that trains next step
        assert carried and carried <= {int(k.rpartition("p")[2]) for k in after["trained"]}
    assert all(r["mean_reward"] == 1.0 for r in records)  # FakeRewards: 1.0 for every sample


class FirstSamplesFirst(FakeEngine):
    """Answers every group's first sample before any second one: the over-sampled group has one
    finished sample (kept, scored) and one aborted when the round ends, so it is carried."""

    def submit(self, requests) -> None:
        super().submit(requests)
        self.out.sort(key=lambda o: int(o.request_id[2:]) % 2)
