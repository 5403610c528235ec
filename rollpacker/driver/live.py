"""LiveBackend: the real rollout engine, reward executor and trainer as one driver backend, and
`StepLoop`, the driver over it.

It talks to them through the Protocols of `rollpacker.core.protocols`: launches become
`GenerationRequest`s (a resumed request carries the token ids of the segments it continues),
engine results become core events, kept samples become reward jobs, micro-batches become
`TrainSample`s with their advantages.

Stream training: a `TrainMicroBatch` goes to the `TrainWorker` (the trainer on a thread of its own)
as soon as the batcher emits it, while the round's other requests keep generating (the engine
decodes in its own thread or server), and the driver goes straight back to feeding the core: the
round ends, and its tail is aborted, when the P-th group completes, not when a micro-batch returns.
Only the single `StepOptimizer` waits for every micro-batch of the step; then the new weights go to
the engine: pause, update, resume.  The step's record (`core.step_record`, the simulator's too) has
`train_overlapped_s` (training while the round generated) and `train_exposed_s` (the training the
step waits for after its last reward).
What it keeps is split by concern: the engine's tokens (`token_store.TokenStore`), the reward jobs
and the times the core must hear of (`reward_staging.RewardStaging`), the step's timeline and
record (`step_log.StepLog`); the step's time limit is the driver's (`watchdog.StepWatch`).
Colocated (`LoopConfig.colocate`, `colocate.Colocation`): micro-batches wait for the round's end,
the engine's memory is released before they train (waited for after the round, so in
`train_exposed_s` or `reward_s`) and resumed with the weight sync (in `sync_s`);
`LoopConfig.train_after_round` holds them the same way, the engine keeping its memory.
Draft sources: after each step an engine that drafts from a prompt's earlier requests
(`DraftKeepingEngine`, the embedded one) is told the sibling groups of the prompts still pending,
so a prompt deferred by a short round drafts from that round's text in its long round.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from attrs import frozen

from rollpacker.core import EpochLedger, Scheduler, commands, events
from rollpacker.core.commands import sibling_group
from rollpacker.core.errors import ConfigError
from rollpacker.core.protocols import (
    DraftKeepingEngine,
    GenerationRequest,
    GenerationResult,
    MicroBatch,
    RewardExecutor,
    RewardJob,
    RolloutEngine,
    TrainSample,
    Trainer,
)
from rollpacker.core.records import PromptKey

from .clock import Clock, WallClock
from .colocate import Colocation
from .loop import Driver, Input
from .observer import NoticeObserver, StepBegun
from .reward_staging import RewardStaging
from .step_log import Interval, StepLog
from .token_store import TokenStore
from .train_worker import OPTIMIZER_STEP, TrainWorker
from .watchdog import StepWatch


def sync_weights(engine: RolloutEngine, trainer: Trainer | TrainWorker, version: int) -> None:
    """Give the trainer's weights to the engine as policy `version`: pause, update, resume (even on error).
    An engine that takes them from the trainer itself (SGLang servers: gathered per parameter, sent
    in buckets or written to disk) does so, on the train worker when given one; others get
    `export_weights()`."""
    engine.pause()
    try:
        if hasattr(engine, "update_weights_from_trainer"):
            push = lambda t: engine.update_weights_from_trainer(t, version)  # noqa: E731
            trainer.call("weight sync", push) if isinstance(trainer, TrainWorker) else push(trainer)
        else:
            engine.update_weights(trainer.export_weights(), version=version)
    finally:
        engine.resume()


class PromptSource(Protocol):
    """The dataset as the loop sees it: token ids to generate from, and a reward job per response."""

    def __len__(self) -> int: ...

    def prompt_ids(self, index: int) -> tuple[int, ...]: ...

    def reward_job(self, request_id: str, index: int, response_ids: Sequence[int]) -> RewardJob: ...


@frozen(kw_only=True)
class LoopConfig:
    temperature: float = 1.0
    """Sampling temperature of rollouts."""
    top_p: float = 1.0
    """Nucleus sampling threshold of rollouts."""
    use_engine_logprobs: bool = True
    """Use the rollout engine's log-probs as the old policy's (else the trainer recomputes them)."""
    poll_s: float = 0.02
    """How long one poll of the engine may wait when nothing else is due."""
    step_timeout_s: float | None = None
    """Fail a step that runs longer than this (None: no limit)."""
    colocate: bool = False
    """The engine and the trainer share the GPUs: train after the round, with the engine's memory released."""
    train_after_round: bool = False
    """Train after the round with the engine's memory kept (`colocate` implies it)."""


class LiveBackend(NoticeObserver):
    def __init__(self, scheduler: Scheduler, engine: RolloutEngine, rewards: RewardExecutor, trainer: Trainer,
                 prompts: PromptSource, clock: Clock, config: LoopConfig | None = None,
                 on_progress: Callable[[str, dict], None] | None = None, watch: StepWatch | None = None) -> None:
        self.sched = scheduler
        """Read only: progress messages name its running requests; `wait` reads its next reward expiry."""
        self.engine = engine
        self.rewards = RewardStaging(rewards, clock)
        self.worker = TrainWorker(trainer, clock)
        """The trainer behind its worker thread: every trainer call of the loop goes through it."""
        self.prompts = prompts
        self.clock = clock
        self.config = config or LoopConfig()
        self.watch = watch or StepWatch(scheduler, clock, self.config.step_timeout_s)
        """The driver's: the optimizer step waits on training at most the step's time left."""
        self.on_progress = on_progress or (lambda stage, info: None)
        self.store = TokenStore()
        self.last_timeline: list[Interval] = []
        self._kept: dict[str, Interval] = {}
        """Intervals of kept samples that may still be scored or trained (a carried group's, in a later step)."""
        self._log = StepLog(start=clock.now())
        held = self.config.colocate or self.config.train_after_round
        self.colocation = Colocation(engine, release=self.config.colocate) if held else None

    @property
    def tokens(self) -> dict[str, GenerationResult]:
        """Results by request id, kept while a sample may still be trained or resumed."""
        return self.store.results

    # -- the step's bounds (notices) -------------------------------------------------------------

    def begin_step(self, notice: StepBegun) -> None:
        self._log = StepLog(start=self.clock.now())
        self.store.begin_step()
        self._kept = {rid: i for rid, i in self._kept.items() if rid in self.store}

    def finish_step(self, ledger: EpochLedger, pending: frozenset[PromptKey]) -> dict:
        log = self._log
        self.last_timeline = list(log.intervals.values())
        self._keep_drafts(pending)
        return log.record(self.clock.now() - log.start, self.engine.capacity, self.store.rewards, ledger, pending)

    def _keep_drafts(self, pending: frozenset[PromptKey]) -> None:
        """A prompt drawn and not trained yet (deferred, carried) runs again in a later round, whose
        requests draft from this one's: an engine that keeps draft sources keeps its group's."""
        if isinstance(self.engine, DraftKeepingEngine):
            self.engine.keep_draft_groups(frozenset(sibling_group(p) for p in pending))

    def pending_work(self) -> str:
        """What the step still waits for besides the core's running requests: the round, the trainer."""
        return (f"round {'ended' if self._log.round_end is not None else 'not ended'}, "
                f"the trainer {'on ' + self.worker.running if self.worker.running else 'idle'}")

    # -- what happened ---------------------------------------------------------------------------

    def wait(self) -> list[Input]:
        """Poll the trainer and the reward executor, then the engine (waiting up to `poll_s` on
        whichever is due); the trainer's finished micro-batches are recorded, never waited for.
        The executor's start grace, when it changed (`StartGrace`), comes first; then, once the
        clock passed the core's next reward expiry, a `DeadlinePassed`: the core expires what its
        deadlines cut, before any answer of the same poll (which is then late)."""
        log = self._log
        log.trained_jobs(self.worker.poll())
        outcomes = self.rewards.poll(timeout=0)
        waiting_on_engine = log.round_end is None
        outputs = self.engine.poll(timeout=self.config.poll_s if waiting_on_engine and not outcomes else 0)
        if not outputs and not outcomes and not waiting_on_engine:
            outcomes = self.rewards.poll(timeout=self.config.poll_s)
        inputs: list[Input] = [self._engine_event(out) for out in outputs if isinstance(out, GenerationResult)]
        inputs += self.rewards.answers(outcomes)
        inputs.extend(self.rewards.hedges_due())  # (after the answers: a sample just answered is not hedged)
        inputs[:0] = self.rewards.grace_news() + self.rewards.expiry_passed(self.sched.next_reward_expiry)
        if inputs:
            self.on_progress("rollout" if log.round_end is None else "reward", self._progress(log))
        return inputs

    def _engine_event(self, result: GenerationResult) -> events.RequestFinished | events.RequestAborted:
        self.store.add(result)
        now = self.clock.now()
        self._log.answered(result, now - self._log.start)
        n = len(result.token_ids)
        if result.finish_reason == "abort":
            return events.RequestAborted(result.request_id, n, now)
        return events.RequestFinished(result.request_id, n, result.finish_reason, now)

    # -- commands --------------------------------------------------------------------------------

    def set_tensor_parallel(self, command: commands.SetTensorParallel) -> None:
        raise ConfigError(
            f"the scheduler asks for rollout TP {command.tp}, but a live engine runs at the TP it was started "
            "with: build the Scheduler without a TpRule (tp=None) for real runs")

    def launch(self, launches: Sequence[commands.LaunchRequest]) -> None:
        requests = [self._generation_request(c) for c in launches]
        self.engine.submit(requests)
        at = self.clock.now() - self._log.start
        for c, request in zip(launches, requests):
            self._log.launched(c.request_id, at, c.prompt.index, request, tuple(seg.request_id for seg in c.resume))

    def abort(self, request_ids: Sequence[str]) -> None:
        self._log.abort_calls.append((self.clock.now() - self._log.start, len(request_ids)))
        self.engine.abort(list(request_ids))

    def keep(self, notice: commands.ScoreSample) -> None:
        sample = notice.sample
        self._log.kept.add(sample.request_id)
        interval = self._log.intervals.get(sample.request_id)
        if interval is not None:
            interval.outcome = "kept"
            self._kept[sample.request_id] = interval
        job = self.prompts.reward_job(sample.request_id, sample.prompt.index, self.store.response_ids(sample.segments))
        self.rewards.stage(sample.request_id, job)

    def start_scoring(self, command: commands.StartScoring) -> None:
        """Stage the scoring (`RewardStaging.start`: the command's time limit, as the simulator's)."""
        if not command.copy:
            self._log.reward_waits.append(command.queued_s)
        self.rewards.start(command)

    def scored(self, notice: events.RewardScored) -> None:
        """Record the reward the core settled (0 for a failure or a scoring its deadline cut)."""
        log = self._log
        log.rewards[notice.request_id] = self.store.rewards[notice.request_id] = notice.reward
        interval = self._kept.get(notice.request_id)
        if interval is not None:  # (its interval may be a past step's: a carried group's reward)
            interval.reward = notice.reward
        log.failed_rewards += notice.failed
        log.reward_answered(self.clock.now() - log.start)

    def close_group(self, notice: commands.CloseGroup) -> None:
        self._log.groups.append(tuple(s.request_id for s in notice.samples))

    def train(self, command: commands.TrainMicroBatch) -> None:
        """Hand the micro-batch to the train worker and return at once."""
        samples = [self._train_sample(ref) for ref in command.samples]
        self.on_progress("train", {"micro_batch": command.index, "samples": len(samples)})
        batch = MicroBatch(tuple(samples))
        if self.colocation is None or not self.colocation.hold(command.index, batch):
            self.worker.forward_backward(command.index, batch)

    def _train_sample(self, ref) -> TrainSample:
        s = ref.sample
        self._log.trained_rewards.append(self.store.rewards[s.request_id])
        if s.request_id in self._kept:
            self._kept[s.request_id].is_trained = True
        return TrainSample(
            prompt_ids=self.prompts.prompt_ids(s.prompt.index),
            response_ids=self.store.response_ids(s.segments),
            advantage=ref.advantage,
            token_weight=ref.token_weight,
            old_logprobs=self.store.logprobs(s.segments) if self.config.use_engine_logprobs else None,
        )

    def end_round(self, notice: commands.EndRound) -> None:
        log = self._log
        log.round_end = self.clock.now() - log.start
        log.report = notice.report
        log.carried = frozenset(notice.carried_requests)
        log.trained = notice.trained
        if self.colocation is not None:  # the engine is idle: its memory goes to the trainer (the release's
            for index, batch in self.colocation.release():  # seconds are waited for after the round: exposed)
                self.worker.forward_backward(index, batch)

    def step_optimizer(self, command: commands.StepOptimizer) -> None:
        """The one wait on training: the step's micro-batches, then the optimizer step, then the sync."""
        log = self._log
        step = (lambda t: t.optimizer_step(command.loss_normalizer)) if command.num_samples else (lambda t: None)
        try:  # (every group filtered out, DAPO: nothing to step, but the micro-batches are still waited for)
            log.step_stats = self.worker.call(OPTIMIZER_STEP, step, timeout=self.watch.time_left())
        except TimeoutError:
            raise self.watch.timed_out(self.pending_work()) from None
        log.trained_jobs(self.worker.poll())
        t = self.clock.now()
        sync = lambda: sync_weights(self.engine, self.worker, version=command.step + 1)  # noqa: E731
        if self.colocation is not None:  # the weights' memory, the sync into it, then the KV cache
            self.colocation.resume(sync)
        else:
            sync()
        log.sync_s += self.clock.now() - t
        self.store.keep_only(log.carried)  # the step is trained: only what a later round resumes or trains
        log.settle_outcomes()

    # -- token ids -------------------------------------------------------------------------------

    def _generation_request(self, c: commands.LaunchRequest) -> GenerationRequest:
        return GenerationRequest(
            request_id=c.request_id,
            prompt_ids=self.prompts.prompt_ids(c.prompt.index),
            max_new_tokens=c.max_new_tokens,
            temperature=self.config.temperature,
            top_p=self.config.top_p,
            seed=c.seed,
            resume_ids=self.store.response_ids(c.resume),
            group=c.sibling_group,
        )

    def _progress(self, log: StepLog) -> dict:
        return {"running": self.sched.state.num_running, "kept": len(log.kept), "rewards": len(log.rewards)}


class StepLoop(Driver):
    """The driver over a `LiveBackend`: run real steps with `run_step()`."""

    def __init__(self, scheduler: Scheduler, engine: RolloutEngine, rewards: RewardExecutor, trainer: Trainer,
                 prompts: PromptSource, config: LoopConfig | None = None,
                 on_progress: Callable[[str, dict], None] | None = None, clock: Clock | None = None) -> None:
        clock = clock or WallClock()
        config = config or LoopConfig()
        watch = StepWatch(scheduler, clock, config.step_timeout_s)
        self.live = LiveBackend(scheduler, engine, rewards, trainer, prompts, clock, config, on_progress, watch)
        super().__init__(scheduler, self.live, clock, watch=watch)

    def close(self) -> None:
        """Stop the train worker (the engine, rewards and trainer are the caller's to close)."""
        self.live.worker.close()

    @property
    def last_timeline(self) -> list[Interval]:
        """The last step's requests, in launch order."""
        return self.live.last_timeline

    @property
    def tokens(self) -> dict[str, GenerationResult]:
        """Results still needed (carried or resumed by a later step), by request id."""
        return self.live.tokens

