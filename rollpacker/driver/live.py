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
Colocated (`LoopConfig.colocate`, `colocate.Colocation`): micro-batches wait for the round's end,
the engine's memory is released before they train (waited for after the round, so in
`train_exposed_s` or `reward_s`) and resumed with the weight sync (in `sync_s`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import Protocol

import attrs
from attrs import frozen

from rollpacker.core import (
    CloseGroup,
    Command,
    EndRound,
    EpochLedger,
    LaunchRequest,
    RequestAborted,
    RequestFinished,
    RewardScored,
    Scheduler,
    ScoreSample,
    SetTensorParallel,
    StartScoring,
    StepOptimizer,
    TrainMicroBatch,
    step_record,
)
from rollpacker.core.errors import ConfigError, RollpackerError
from rollpacker.core.protocols import (
    GenerationRequest,
    GenerationResult,
    MicroBatch,
    RewardExecutor,
    RewardJob,
    RewardOutcome,
    RolloutEngine,
    TrainSample,
    Trainer,
)
from rollpacker.core.records import PromptKey, Sample, Segment

from .clock import Clock, WallClock
from .colocate import Colocation
from .loop import DeadlinePassed, Driver, HedgeDue, Input, Notice, ScorerAnswered, StepBegun
from .step_log import Interval, StepLog
from .train_worker import OPTIMIZER_STEP, TrainerRan, TrainWorker


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


class StepTimeout(RollpackerError):
    """A step ran past its wall-clock limit (a stuck engine or scorer); names what was pending."""


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


class LiveBackend:
    def __init__(self, scheduler: Scheduler, engine: RolloutEngine, rewards: RewardExecutor, trainer: Trainer,
                 prompts: PromptSource, clock: Clock, config: LoopConfig | None = None,
                 on_progress: Callable[[str, dict], None] | None = None) -> None:
        self.sched = scheduler
        """Read only: progress and timeout messages name its running requests."""
        self.engine = engine
        self.rewards = rewards
        self.worker = TrainWorker(trainer, clock)
        """The trainer behind its worker thread: every trainer call of the loop goes through it."""
        self.prompts = prompts
        self.clock = clock
        self.config = config or LoopConfig()
        self.on_progress = on_progress or (lambda stage, info: None)
        self.tokens: dict[str, GenerationResult] = {}
        """Results by request id, kept while a sample may still be trained or resumed."""
        self.last_timeline: list[Interval] = []
        self.sample_rewards: dict[str, float] = {}
        """Rewards by request id, kept while their sample may still be trained (a carried group's
        samples are scored in one step and trained in a later one)."""
        self._kept: dict[str, Interval] = {}
        """Intervals of kept samples that may still be scored or trained (a carried group's, in a later step)."""
        self._reward_jobs: dict[str, RewardJob] = {}
        """Reward jobs of kept samples until their first answer (a hedge runs the same job again)."""
        self._deadlines: list[float] = []
        """The started scorings' `StartScoring.deadline`s, a heap: `wait` tells the core when one passed."""
        self._hedged: set[str] = set()
        """Samples with hedged copies in flight: the first answer cancels the others."""
        self._hedge_due: list[float] = []
        """Heap of the StartScoring `hedge_at` times still ahead (each a HedgeDue for the core)."""
        self._log = StepLog(start=clock.now())
        self.colocation = Colocation(engine) if self.config.colocate else None

    # -- what the driver tells -------------------------------------------------------------------

    def observe(self, notice: Notice) -> None:
        """The driver's notices, each to its method below."""
        match notice:
            case StepBegun():
                self.begin_step(notice.commands)
            case ScoreSample():
                self.keep(notice.sample)
            case RewardScored():
                self.scored(notice)
            case CloseGroup():
                self.close_group(notice)
            case EndRound():
                self.end_round(notice)

    # -- the step's bounds -----------------------------------------------------------------------

    def begin_step(self, commands: Sequence[Command]) -> None:
        self._log = StepLog(start=self.clock.now())
        self.sample_rewards = {rid: r for rid, r in self.sample_rewards.items() if rid in self.tokens}
        self._kept = {rid: i for rid, i in self._kept.items() if rid in self.tokens}

    def finish_step(self, ledger: EpochLedger, pending: frozenset[PromptKey]) -> dict:
        self.last_timeline = list(self._log.intervals.values())
        return self._record(self._log, ledger, pending)

    # -- what happened ---------------------------------------------------------------------------

    def wait(self) -> list[Input]:
        """Poll the trainer and the reward executor, then the engine (waiting up to `poll_s` on
        whichever is due); the trainer's finished micro-batches are recorded, never waited for.
        Once the clock passes a `StartScoring.deadline`, a `DeadlinePassed` comes first: the core
        expires what its deadline cut, before any answer of the same poll (which is then late)."""
        log = self._log
        self._check_deadline(log)
        self._trained(self.worker.poll())
        outcomes = self.rewards.poll(timeout=0)
        waiting_on_engine = log.round_end is None
        outputs = self.engine.poll(timeout=self.config.poll_s if waiting_on_engine and not outcomes else 0)
        if not outputs and not outcomes and not waiting_on_engine:
            outcomes = self.rewards.poll(timeout=self.config.poll_s)
        inputs: list[Input] = [self._engine_event(out) for out in outputs if isinstance(out, GenerationResult)]
        answers = self._first_answers(outcomes)
        inputs += [ScorerAnswered(o.request_id, o.reward, o.failed, o.latency_s) for o in answers]
        inputs.extend(self._hedges_due())  # (after the answers: a sample just answered is not hedged)
        if self._deadline_passed():
            inputs.insert(0, DeadlinePassed())
        if inputs:
            self.on_progress("rollout" if log.round_end is None else "reward", self._progress(log))
        return inputs

    def _deadline_passed(self) -> bool:
        """Whether the clock passed a scoring's deadline since the last call (its deadlines are dropped)."""
        return bool(_pop_due(self._deadlines, self.clock.now()))

    def _hedges_due(self) -> list[Input]:
        """One HedgeDue once the clock passed a scoring's `hedge_at` (the core hedges every due one)."""
        return [HedgeDue()] if _pop_due(self._hedge_due, self.clock.now()) else []

    def _first_answers(self, outcomes: Sequence[RewardOutcome]) -> list[RewardOutcome]:
        """Each sample's first answer (any copy's); the other copies of a hedged one are cancelled."""
        first = []
        for outcome in outcomes:
            if self._reward_jobs.pop(outcome.request_id, None) is None:
                continue  # another copy answered first
            if outcome.request_id in self._hedged:
                self._hedged.discard(outcome.request_id)
                self.rewards.cancel(outcome.request_id)
            first.append(outcome)
        return first

    def _engine_event(self, result: GenerationResult) -> RequestFinished | RequestAborted:
        self.tokens[result.request_id] = result
        now = self.clock.now()
        log = self._log
        log.occupancy.change(now - log.start, -1)
        interval = log.intervals.get(result.request_id)
        if interval is not None:
            interval.end = now - log.start
            interval.outcome = "aborted" if result.finish_reason == "abort" else "wasted"
            interval.num_tokens, interval.finish_reason = len(result.token_ids), result.finish_reason
            interval.token_ids = result.token_ids
        n = len(result.token_ids)
        if result.finish_reason == "abort":
            return RequestAborted(result.request_id, n, now)
        return RequestFinished(result.request_id, n, result.finish_reason, now)

    # -- commands --------------------------------------------------------------------------------

    def set_tensor_parallel(self, command: SetTensorParallel) -> None:
        raise ConfigError(
            f"the scheduler asks for rollout TP {command.tp}, but a live engine runs at the TP it was started "
            "with: build the Scheduler without a TpRule (tp=None) for real runs")

    def launch(self, commands: Sequence[LaunchRequest]) -> None:
        requests = [self._generation_request(c) for c in commands]
        self.engine.submit(requests)
        log = self._log
        at = self.clock.now() - log.start
        for c, request in zip(commands, requests):
            log.intervals[c.request_id] = Interval(c.request_id, at, prompt=c.prompt.index, request=request,
                                                   resumes=tuple(seg.request_id for seg in c.resume))
            log.occupancy.change(at, +1)

    def abort(self, request_ids: Sequence[str]) -> None:
        self.engine.abort(list(request_ids))

    def keep(self, sample: Sample) -> None:
        self._log.kept.add(sample.request_id)
        interval = self._log.intervals.get(sample.request_id)
        if interval is not None:
            interval.outcome = "kept"
            self._kept[sample.request_id] = interval
        job = self.prompts.reward_job(sample.request_id, sample.prompt.index, self._response_ids(sample.segments))
        self._reward_jobs[sample.request_id] = job

    def start_scoring(self, command: StartScoring) -> None:
        """Send the job to the executor with the core's timeout (its worker is killed past it; a hedge:
        the time left), and expire it by the core's clock at `command.deadline` (`wait`), as the
        simulator does."""
        if command.copy:
            self._hedged.add(command.request_id)
        else:
            self._log.reward_waits.append(command.queued_s)
        if command.hedge_at is not None:
            heapq.heappush(self._hedge_due, command.hedge_at)
        job = self._reward_jobs[command.request_id]
        self.rewards.submit(attrs.evolve(job, deadline_s=command.timeout, copy=command.copy))
        heapq.heappush(self._deadlines, command.deadline)

    def scored(self, event: RewardScored) -> None:
        """Record the reward the core settled (0 for a failure or a scoring its deadline cut)."""
        log = self._log
        log.rewards[event.request_id] = self.sample_rewards[event.request_id] = event.reward
        interval = self._kept.get(event.request_id)
        if interval is not None:  # (its interval may be a past step's: a carried group's reward)
            interval.reward = event.reward
        log.failed_rewards += event.failed
        log.reward_answered(self.clock.now() - log.start)

    def close_group(self, command: CloseGroup) -> None:
        self._log.groups.append(tuple(s.request_id for s in command.samples))

    def train(self, command: TrainMicroBatch) -> None:
        """Hand the micro-batch to the train worker and return at once."""
        samples = [self._train_sample(ref) for ref in command.samples]
        self.on_progress("train", {"micro_batch": command.index, "samples": len(samples)})
        batch = MicroBatch(tuple(samples))
        if self.colocation is None or not self.colocation.hold(command.index, batch):
            self.worker.forward_backward(command.index, batch)

    def _trained(self, jobs: Sequence[TrainerRan]) -> None:
        """Record what the worker finished: micro-batch statistics, and when it trained (the timeline's
        training lane; exporting weights is sync time, not training)."""
        log = self._log
        for job in jobs:
            if job.micro_batch is not None:
                log.train_stats.append(job.stats)
            if job.micro_batch is not None or job.what == OPTIMIZER_STEP:
                log.train_spans.append((job.start - log.start, job.end - log.start, job.what))

    def _train_sample(self, ref) -> TrainSample:
        s = ref.sample
        self._log.trained_rewards.append(self.sample_rewards[s.request_id])
        if s.request_id in self._kept:
            self._kept[s.request_id].is_trained = True
        return TrainSample(
            prompt_ids=self.prompts.prompt_ids(s.prompt.index),
            response_ids=self._response_ids(s.segments),
            advantage=ref.advantage,
            token_weight=ref.token_weight,
            old_logprobs=self._logprobs(s.segments) if self.config.use_engine_logprobs else None,
        )

    def end_round(self, command: EndRound) -> None:
        log = self._log
        log.round_end = self.clock.now() - log.start
        log.report = command.report
        log.carried = frozenset(command.carried_requests)
        log.trained = command.trained
        if self.colocation is not None:  # the engine is idle: its memory goes to the trainer (the release's
            for index, batch in self.colocation.release():  # seconds are waited for after the round: exposed)
                self.worker.forward_backward(index, batch)

    def step_optimizer(self, command: StepOptimizer) -> None:
        """The one wait on training: the step's micro-batches, then the optimizer step, then the sync."""
        log = self._log
        step = (lambda t: t.optimizer_step(command.loss_normalizer)) if command.num_samples else (lambda t: None)
        try:  # (every group filtered out, DAPO: nothing to step, but the micro-batches are still waited for)
            log.step_stats = self.worker.call(OPTIMIZER_STEP, step, timeout=self._time_left(log))
        except TimeoutError:
            raise self._timed_out(log) from None
        self._trained(self.worker.poll())
        log.stepped = True
        t = self.clock.now()
        sync = lambda: sync_weights(self.engine, self.worker, version=command.step + 1)  # noqa: E731
        if self.colocation is not None:  # the weights' memory, the sync into it, then the KV cache
            self.colocation.resume(sync)
        else:
            sync()
        log.sync_s += self.clock.now() - t
        # the step is trained: only tokens that a later round resumes or trains are still needed
        self.tokens = {rid: r for rid, r in self.tokens.items() if rid in log.carried}
        self._settle_outcomes()

    def _settle_outcomes(self) -> None:
        """A sample scored but not trained this step is carried (a later step trains it) or wasted
        (its prompt was deferred): the timeline then agrees with the step's kept tokens."""
        for interval in self._log.intervals.values():
            if interval.outcome == "kept" and not interval.is_trained:
                interval.outcome = "carried" if interval.request_id in self._log.carried else "wasted"

    # -- token ids -------------------------------------------------------------------------------

    def _generation_request(self, c: LaunchRequest) -> GenerationRequest:
        return GenerationRequest(
            request_id=c.request_id,
            prompt_ids=self.prompts.prompt_ids(c.prompt.index),
            max_new_tokens=c.max_new_tokens,
            temperature=self.config.temperature,
            top_p=self.config.top_p,
            seed=c.seed,
            resume_ids=self._response_ids(c.resume),
            group=c.sibling_group,
        )

    def _response_ids(self, segments: Sequence[Segment]) -> tuple[int, ...]:
        """The token ids of a sample (or a resumed prefix): its segments' requests' tokens, in order."""
        return tuple(t for seg in segments for t in self.tokens[seg.request_id].token_ids[: seg.num_tokens])

    def _logprobs(self, segments: Sequence[Segment]) -> tuple[float, ...]:
        """The engine's log-probs of the same tokens."""
        return tuple(x for seg in segments for x in self.tokens[seg.request_id].logprobs[: seg.num_tokens])

    # -- bookkeeping -----------------------------------------------------------------------------

    def _time_left(self, log: StepLog) -> float | None:
        """Seconds until the step's limit (None: no limit)."""
        limit = self.config.step_timeout_s
        return None if limit is None else max(0.0, limit - (self.clock.now() - log.start))

    def _check_deadline(self, log: StepLog) -> None:
        limit = self.config.step_timeout_s
        if limit is not None and self.clock.now() - log.start > limit:
            raise self._timed_out(log)

    def _timed_out(self, log: StepLog) -> StepTimeout:
        """What was pending when the step ran past its limit: requests, the round, the trainer's job."""
        running = self.sched.state.num_running
        return StepTimeout(
            f"step {self.sched.state.step} ran past step_timeout_s={self.config.step_timeout_s}: {running} requests "
            f"still running, round {'ended' if log.round_end is not None else 'not ended'}, "
            f"the trainer {'on ' + self.worker.running if self.worker.running else 'idle'}"
        )

    def _progress(self, log: StepLog) -> dict:
        return {"running": self.sched.state.num_running, "kept": len(log.kept), "rewards": len(log.rewards)}

    def _record(self, log: StepLog, ledger: EpochLedger, pending: frozenset[PromptKey]) -> dict:
        rewards = log.trained_rewards
        spreads = [max(r) - min(r) for r in ([self.sample_rewards[i] for i in g] for g in log.groups) if r]
        loss_sum = sum(s.loss_sum for s in log.train_stats)
        tokens = sum(s.num_tokens for s in log.train_stats)
        entropy = sum(s.entropy_sum for s in log.train_stats)
        return step_record(
            log.report, log.times(self.clock.now() - log.start), log.occupancy, self.engine.capacity,
            mean_reward=sum(rewards) / len(rewards) if rewards else 0.0,
            reward_failures=log.failed_rewards,
            reward_wait_s_mean=sum(log.reward_waits) / len(log.reward_waits) if log.reward_waits else 0.0,
            reward_wait_s_max=max(log.reward_waits, default=0.0),
            nonzero_variance_groups=sum(1 for s in spreads if s > 0) / len(spreads) if spreads else 0.0,
            loss=loss_sum / tokens if tokens else 0.0,
            trained=[str(k) for k in log.trained],
            pending_prompts=len(pending),
            duplicate_prompts=ledger.duplicates,
            entropy=entropy / tokens if tokens else 0.0,
            grad_norm=log.step_stats.grad_norm if log.step_stats is not None else None,
            requests=[[i.prompt, i.num_tokens, i.finish_reason, i.request_id, i.reward]
                      for i in log.intervals.values() if i.finish_reason],
            train_spans=[[round(a, 4), round(b, 4), what] for a, b, what in log.train_spans],
        )


class StepLoop(Driver):
    """The driver over a `LiveBackend`: run real steps with `run_step()`."""

    def __init__(self, scheduler: Scheduler, engine: RolloutEngine, rewards: RewardExecutor, trainer: Trainer,
                 prompts: PromptSource, config: LoopConfig | None = None,
                 on_progress: Callable[[str, dict], None] | None = None, clock: Clock | None = None) -> None:
        clock = clock or WallClock()
        self.live = LiveBackend(scheduler, engine, rewards, trainer, prompts, clock, config, on_progress)
        super().__init__(scheduler, self.live, clock)

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


def _pop_due(heap: list[float], now: float) -> int:
    """Pop the times in `heap` that `now` passed; how many there were."""
    count = 0
    while heap and heap[0] <= now:
        heapq.heappop(heap)
        count += 1
    return count
