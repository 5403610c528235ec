"""StepLoop against a scripted fake engine, reward executor and trainer (no model): the loop turns
results into events, trains finished groups while the round still generates, hands the trainer the
right tokens with advantages of the right sign, forwards aborts, and syncs weights after the step."""

from __future__ import annotations

from rollpacker.core import BatcherConfig, Scheduler, make_policy
from rollpacker.core.protocols import GenerationResult, RewardJob, RewardOutcome, TrainStats
from rollpacker.driver import StepLoop

GOOD, BAD = 7, 8
"""First response token of a rewarded (GOOD) and an unrewarded (BAD) response."""


class ScriptedEngine:
    """Answers one request per poll, in submission order; request k's response is
    (GOOD or BAD alternately, k, k).  An aborted request answers "abort" with no tokens."""

    capacity = 16

    def __init__(self, calls: list) -> None:
        self.calls, self.queue, self.submitted = calls, [], 0

    def submit(self, requests) -> None:
        for r in requests:
            k = self.submitted
            self.submitted += 1
            tokens = ((GOOD if k % 2 == 0 else BAD), k, k)
            self.queue.append(GenerationResult(r.request_id, tokens, (-0.5,) * 3, "stop", 0, 0.0))

    def poll(self, timeout=None):
        out, self.queue = self.queue[:1], self.queue[1:]
        return out

    def abort(self, request_ids) -> None:
        self.calls += [("abort", rid) for rid in request_ids]
        gone = set(request_ids)
        self.queue = [GenerationResult(r.request_id, (), (), "abort", 0, 0.0) if r.request_id in gone else r
                      for r in self.queue]

    def pause(self) -> None:
        self.calls.append(("pause",))

    def update_weights(self, weights, version) -> None:
        self.calls.append(("update_weights", version))

    def resume(self) -> None:
        self.calls.append(("resume",))

    def close(self) -> None: ...


class ScriptedRewards:
    """Reward 1 for a response that starts with GOOD, else 0; answered on the next poll."""

    def __init__(self) -> None:
        self.ready: list = []

    def submit(self, job: RewardJob) -> None:
        self.ready.append(RewardOutcome(job.request_id, float(job.response[0] == GOOD), "ok"))

    def poll(self, timeout=None):
        out, self.ready = self.ready, []
        return out

    def close(self) -> None: ...


class RecordingTrainer:
    def __init__(self, calls: list, engine: ScriptedEngine) -> None:
        self.calls, self.engine, self.samples = calls, engine, []

    def forward_backward(self, batch) -> TrainStats:
        self.calls.append(("forward_backward", len(self.engine.queue)))
        self.samples += batch.samples
        return TrainStats(0.0, sum(len(s.response_ids) for s in batch.samples))

    def optimizer_step(self, loss_normalizer) -> TrainStats:
        self.calls.append(("optimizer_step", loss_normalizer))
        return TrainStats(0.0, 0)

    def export_weights(self):
        return {}


class Prompts:
    def __len__(self) -> int:
        return 4

    def prompt_ids(self, index: int) -> tuple[int, ...]:
        return (100 + index,)

    def reward_job(self, request_id, index, response_ids) -> RewardJob:
        return RewardJob(request_id, "scripted", index, response_ids)


def run_one_step(policy, handed: list | None = None):
    """`handed` gets, for each micro-batch the loop hands to the trainer, the engine's unanswered requests."""
    calls: list = []
    engine = ScriptedEngine(calls)
    trainer = RecordingTrainer(calls, engine)
    sched = Scheduler(policy, num_prompts=4, batcher=BatcherConfig(token_budget=1))

    def on_progress(stage, info):
        if stage == "train" and handed is not None:
            handed.append(len(engine.queue))

    record = StepLoop(sched, engine, ScriptedRewards(), trainer, Prompts(), on_progress=on_progress).run_step()
    return calls, trainer, record


def test_loop_streams_trains_the_right_tokens_and_syncs_weights():
    handed: list = []
    calls, trainer, record = run_one_step(make_policy("sync", prompts=2, samples=2, max_tokens=8), handed)
    names = [c[0] for c in calls]
    assert names == ["forward_backward"] * 4 + ["optimizer_step", "pause", "update_weights", "resume"]
    assert handed[0] > 0, "the first micro-batch goes to the trainer while the other group still generates"
    assert ("update_weights", 1) in calls  # the new weights are version step + 1
    assert calls[4] == ("optimizer_step", 12.0)  # token-mean: 4 responses x 3 tokens
    assert sorted(s.response_ids[1] for s in trainer.samples) == [0, 1, 2, 3]
    for s in trainer.samples:
        assert s.prompt_ids[0] in (100, 101, 102, 103) and s.old_logprobs == (-0.5,) * 3
        assert (s.advantage > 0) == (s.response_ids[0] == GOOD), "the gradient's sign follows the reward"
    assert record["trained_prompts"] == 2 and record["launched_requests"] == 4


def test_loop_forwards_aborts_and_never_trains_an_aborted_response():
    """Tail batching over-launches (eta 1.25 x 2 prompts = 3 groups of 3): the requests still
    running when two groups complete are aborted through the engine."""
    calls, trainer, record = run_one_step(make_policy("tail", prompts=2, samples=2, max_tokens=8))
    aborted = {c[1] for c in calls if c[0] == "abort"}
    assert aborted and record["launched_requests"] == 9
    assert len(trainer.samples) == 4 and all(len(s.response_ids) == 3 for s in trainer.samples)
    assert [c[0] for c in calls[-3:]] == ["pause", "update_weights", "resume"]


class InterleavedEngine(ScriptedEngine):
    """Answers every group's first request, then every group's second, ...: when the round ends, a
    group that is not complete has samples already scored."""

    def submit(self, requests) -> None:
        super().submit(requests)
        seen: dict = {}
        rank = {}
        for r in requests:
            rank[r.request_id] = seen[r.group] = seen.get(r.group, -1) + 1
        self.queue.sort(key=lambda res: rank.get(res.request_id, -1))


def test_timeline_kept_tokens_are_the_trained_ones():
    """A sample scored but not trained (its prompt deferred, or carried) is not drawn as kept."""
    for policy in (make_policy("tail", prompts=2, samples=2, max_tokens=8),
                   make_policy("partial", prompts=2, samples=2, max_tokens=8)):
        calls = []
        engine = InterleavedEngine(calls)
        sched = Scheduler(policy, num_prompts=4, batcher=BatcherConfig(token_budget=1))
        loop = StepLoop(sched, engine, ScriptedRewards(), RecordingTrainer(calls, engine), Prompts())
        record = loop.run_step()
        intervals = list(loop.last_timeline)
        assert sum(i.num_tokens for i in intervals if i.outcome == "kept") == record["kept_tokens"]
        assert all(i.is_trained for i in intervals if i.outcome == "kept")
        assert not any(i.is_trained for i in intervals if i.outcome in ("wasted", "carried", "aborted"))
        scored_untrained = [i for i in intervals if i.reward is not None and not i.is_trained]
        assert scored_untrained, "the case under test: a sample scored in this step but not trained"
