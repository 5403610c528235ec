"""The train worker: training runs on a thread of its own, so the driver never waits on it until the
optimizer step.  With the real embedded engine and the real PyTorch trainer, a round's tail is
aborted while a micro-batch is still inside the trainer; the worker's gradient is bit-identical to
the same micro-batches trained directly; a trainer that raises fails the step with a backend error
naming the micro-batch (never a hang); the step's training splits into overlapped and exposed time."""

from __future__ import annotations

import math
import threading

import pytest
import torch

from rollpacker.backends.embedded.engine import EmbeddedEngine
from rollpacker.backends.errors import BackendError, InvalidMicroBatch, TrainerFailed
from rollpacker.backends.models import load_model, tiny_random_llama
from rollpacker.backends.trainer.pytorch import TorchTrainer, TorchTrainerConfig
from rollpacker.core import BatcherConfig, Scheduler, make_policy
from rollpacker.core.protocols import MicroBatch, RewardOutcome, TrainSample
from rollpacker.driver import LoopConfig, StepLoop, StepTimeout, WallClock
from rollpacker.core.metrics import split_training
from rollpacker.driver.train_worker import TrainWorker
from test_step_loop import Prompts, RecordingTrainer, ScriptedEngine, ScriptedRewards


@pytest.fixture(scope="module")
def tiny():
    return tiny_random_llama()


def trainer_of(model_dir) -> TorchTrainer:
    return TorchTrainer(TorchTrainerConfig(model_dir=str(model_dir), lr=1e-3, seed=0, device="cpu"))


def micro_batches(seed: int = 0) -> list[MicroBatch]:
    g = torch.Generator().manual_seed(seed)

    def sample(n: int, advantage: float) -> TrainSample:
        ids = torch.randint(5, 4000, (n + 3,), generator=g).tolist()
        return TrainSample(tuple(ids[:3]), tuple(ids[3:]), advantage, 1.0)

    return [MicroBatch((sample(7, 1.0), sample(4, -0.5))), MicroBatch((sample(9, -1.0),)),
            MicroBatch((sample(5, 0.25), sample(6, 0.75)))]


@pytest.mark.timeout(300)
def test_the_worker_trains_bit_identically_to_direct_calls_in_the_same_order(tiny):
    direct, threaded = trainer_of(tiny), trainer_of(tiny)
    direct_stats = [direct.forward_backward(mb) for mb in micro_batches()] + [direct.optimizer_step(20.0)]
    worker = TrainWorker(threaded, WallClock())
    try:
        for k, mb in enumerate(micro_batches()):
            worker.forward_backward(k, mb)  # returns at once
        step = worker.call("optimizer step", lambda t: t.optimizer_step(20.0))
        ran = worker.poll()
        weights = worker.export_weights()
    finally:
        worker.close()
    assert [r.what for r in ran] == ["micro-batch 0", "micro-batch 1", "micro-batch 2", "optimizer step"]
    assert [r.stats for r in ran] == direct_stats and step == direct_stats[-1]
    assert all(a.end <= b.start for a, b in zip(ran, ran[1:])), "one trainer: jobs never overlap"
    expected = direct.export_weights()
    assert weights.keys() == expected.keys()
    assert all(torch.equal(weights[k], expected[k]) for k in expected), "same gradient, same update, to the bit"


class FailingTrainer(RecordingTrainer):
    """Refuses its second micro-batch (as a trainer does a bad one)."""

    def forward_backward(self, batch):
        if sum(1 for c in self.calls if c[0] == "forward_backward") == 1:
            self.calls.append(("refused",))
            raise InvalidMicroBatch("sample 0: token id 999999 is outside the vocabulary")
        return super().forward_backward(batch)


@pytest.mark.timeout(120)
def test_a_trainer_error_on_the_worker_fails_the_step_on_the_driver_thread_with_its_cause():
    calls: list = []
    engine = ScriptedEngine(calls)
    sched = Scheduler(make_policy("sync", prompts=2, samples=2, max_tokens=8), num_prompts=4,
                      batcher=BatcherConfig(token_budget=1))
    loop = StepLoop(sched, engine, ScriptedRewards(), FailingTrainer(calls, engine), Prompts())
    with pytest.raises(TrainerFailed, match="micro-batch 1: InvalidMicroBatch: sample 0: token id 999999") as info:
        loop.run_step()
    loop.close()
    assert isinstance(info.value, BackendError) and isinstance(info.value.__cause__, InvalidMicroBatch)
    names = [c[0] for c in calls]
    assert names.count("forward_backward") == 1, "nothing is trained after the failed micro-batch"
    assert "optimizer_step" not in names and "update_weights" not in names, "a failed step never steps or syncs"


def test_training_splits_into_time_under_the_rollout_and_time_after_it():
    spans = [(1.0, 3.0, "micro-batch 0"), (3.0, 7.0, "micro-batch 1"), (8.0, 9.5, "optimizer step")]
    assert split_training(spans, round_end=5.0) == (4.0, 3.5)
    assert split_training(spans, round_end=0.5) == (0.0, 7.5)
    assert split_training(spans, round_end=20.0) == (7.5, 0.0)
    assert split_training([], round_end=5.0) == (0.0, 0.0)


# -- the real engine and trainer --------------------------------------------------------------------

class WatchedEngine(EmbeddedEngine):
    """The embedded engine, noting each abort call in `log`."""

    def __init__(self, *args, log: list, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.log = log

    def abort(self, request_ids) -> None:
        self.log.append(("abort", tuple(request_ids)))
        super().abort(request_ids)


class HeldTrainer(TorchTrainer):
    """The PyTorch trainer whose first micro-batch does not finish before the round is over
    (`round_over`): a micro-batch that outlives the round, whatever the machine's speed.  On the
    driver's own thread (a synchronous loop) the round cannot end during the call, so it goes on."""

    def __init__(self, config, log: list) -> None:
        super().__init__(config)
        self.log, self.round_over = log, threading.Event()
        self.driver_thread = threading.current_thread()

    def forward_backward(self, batch):
        first = not any(entry[0] == "train starts" for entry in self.log)
        self.log.append(("train starts",))
        stats = super().forward_backward(batch)
        if first and threading.current_thread() is not self.driver_thread:
            assert self.round_over.wait(timeout=300), "the round never ended while a micro-batch trained"
        self.log.append(("train returns",))
        return stats


class ParityRewards(ScriptedRewards):
    """Reward 1 for a response whose first token id is even: groups whose rewards differ."""

    def submit(self, job) -> None:
        self.ready.append(RewardOutcome(job.request_id, float(job.response[0] % 2 == 0), "ok"))


@pytest.mark.timeout(600)
def test_real_engine_and_trainer_the_tail_is_aborted_while_a_micro_batch_trains(tiny):
    """Tail batching (P=2, R=2: 3 groups of 3) on an engine of 3 rows: the groups decode one after
    another, so when the second completes the third is still to run and is aborted.  The first
    group's micro-batch is in the trainer meanwhile; the abort comes before it returns."""
    log: list = []
    model, _ = load_model(tiny)
    engine = WatchedEngine(model, capacity=3, stop_token_ids=(), log=log)
    trainer = HeldTrainer(TorchTrainerConfig(model_dir=str(tiny), lr=1e-3, seed=0, device="cpu"), log)
    sched = Scheduler(make_policy("tail", prompts=2, samples=2, max_tokens=12), num_prompts=4,
                      batcher=BatcherConfig(token_budget=1))
    loop = StepLoop(sched, engine, ParityRewards(), trainer, Prompts())
    end_round = loop.live.end_round

    def round_ended(command):  # the test watches the backend end the round, then lets training go on
        end_round(command)
        trainer.round_over.set()

    loop.live.end_round = round_ended
    try:
        record = loop.run_step()
    finally:
        loop.close()
        engine.close()
    aborted = {i.request_id for i in loop.last_timeline if i.outcome == "aborted"}
    assert aborted, "the case under test: the round's tail is aborted"
    tail_abort = next(k for k, entry in enumerate(log) if entry[0] == "abort" and aborted & set(entry[1]))
    names = [entry[0] for entry in log]
    assert names.index("train starts") < tail_abort < names.index("train returns"), \
        "the tail was aborted while the first micro-batch was inside the trainer"
    assert record["trained_prompts"] == 2 and names.count("train returns") == 4 and math.isfinite(record["loss"])
    assert record["train_overlapped_s"] > 0 and record["step_s"] >= record["rollout_s"]
    assert [s[2] for s in record["train_spans"]][-1] == "optimizer step" and len(record["train_spans"]) == 5


class StuckTrainer(RecordingTrainer):
    """Its second micro-batch never finishes (until the test lets it go)."""

    def __init__(self, calls: list, engine) -> None:
        super().__init__(calls, engine)
        self.release = threading.Event()

    def forward_backward(self, batch):
        if sum(1 for c in self.calls if c[0] == "forward_backward") == 1:
            self.release.wait(timeout=300)
        return super().forward_backward(batch)


@pytest.mark.timeout(120)
def test_a_stuck_trainer_fails_the_step_at_its_timeout_naming_the_micro_batch():
    calls: list = []
    engine = ScriptedEngine(calls)
    trainer = StuckTrainer(calls, engine)
    sched = Scheduler(make_policy("sync", prompts=2, samples=2, max_tokens=8), num_prompts=4,
                      batcher=BatcherConfig(token_budget=1))
    loop = StepLoop(sched, engine, ScriptedRewards(), trainer, Prompts(), LoopConfig(step_timeout_s=5.0))
    try:
        with pytest.raises(StepTimeout, match="step_timeout_s=5.0: .* the trainer on micro-batch 1"):
            loop.run_step()
    finally:
        trainer.release.set()
        loop.close()
    assert "optimizer_step" not in [c[0] for c in calls]
