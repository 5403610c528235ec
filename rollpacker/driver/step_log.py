"""One step of a live run as the driver records it: each request's `Interval` on the step's
timeline (what the engine was asked, what it answered, whether its sample was kept, scored, trained)
and the step's `StepLog` (rewards, trained samples, when the trainer trained, time spent syncing)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from attrs import define, field

from rollpacker.core import EpochLedger, step_record
from rollpacker.core.metrics import Occupancy, StepTimes
from rollpacker.core.protocols import GenerationRequest, GenerationResult
from rollpacker.core.records import PromptKey

from .train_worker import OPTIMIZER_STEP, TrainerRan


@define
class Interval:
    """One request on the timeline of a step (seconds from the step's start)."""

    request_id: str
    start: float
    end: float | None = None
    outcome: str = "running"
    """"kept" (scored; at the step's end only if trained), "carried" (trained in a later step), "aborted", or
    "wasted" (finished but not trained)."""
    prompt: int = -1
    """Dataset index of its prompt."""
    num_tokens: int = 0
    finish_reason: str = ""
    """The engine's: "stop", "length" or "abort" (empty while running)."""
    request: GenerationRequest | None = None
    """What the engine was asked (prompt and resumed ids, seed, max tokens): enough to generate it again."""
    resumes: tuple[str, ...] = ()
    """Ids of the requests whose tokens it continues (partial rollout), oldest first."""
    token_ids: tuple[int, ...] = ()
    """The tokens it generated (this request's own, without the resumed ones)."""
    reward: float | None = None
    """Its sample's reward, if it was kept and scored (0.0 when the scorer failed)."""
    is_trained: bool = False
    """Its sample went into a micro-batch (in this step or, carried, in a later one)."""
    way_back_s: float | None = None
    """Seconds from the engine's end of it to its result, where the engine says (`GenerationResult.way_back_s`)."""
    way_in_s: float | None = None
    """Seconds from its sending to the engine's queue, where the engine says (`GenerationResult.way_in_s`)."""


@define
class StepLog:
    """What the live backend records of one step: its requests, rewards, trained samples and timings."""

    start: float
    occupancy: Occupancy = field(factory=Occupancy)
    intervals: dict[str, Interval] = field(factory=dict)
    kept: set[str] = field(factory=set)
    rewards: dict[str, float] = field(factory=dict)
    failed_rewards: int = 0
    reward_waits: list[float] = field(factory=list)
    trained_rewards: list[float] = field(factory=list)
    groups: list[tuple[str, ...]] = field(factory=list)
    trained: tuple = ()
    carried: frozenset[str] = frozenset()
    round_end: float | None = None
    report: Any = None
    train_spans: list[tuple[float, float, str]] = field(factory=list)
    """(start, end, what) of each micro-batch and the optimizer step, seconds from the step's start, in order."""
    abort_calls: list[tuple[float, int]] = field(factory=list)
    """(when, how many requests) of each abort the driver sent the engine, seconds from the step's start."""
    rewards_done: float = 0.0
    """When the last reward answer the step waited for came, seconds from the step's start."""
    sync_s: float = 0.0
    train_stats: list = field(factory=list)
    step_stats: Any = None

    @property
    def stepped(self) -> bool:
        """The optimizer has stepped (its span is recorded): a reward answered since (a carried sample's,
        fed with the answer that completed the step) is no wait of this step's."""
        return any(what == OPTIMIZER_STEP for *_, what in self.train_spans)

    def reward_answered(self, at: float) -> None:
        """A reward answer came `at` seconds into the step; it ends the reward wait unless the
        optimizer has already stepped."""
        if not self.stepped:
            self.rewards_done = at

    def times(self, end: float) -> StepTimes:
        """The step's marks for its record (seconds from its start), the step ending at `end`; a
        round that never ended (never seen) counts as ending when the trainer was done."""
        round_end = self.round_end if self.round_end is not None else end - self.sync_s
        return StepTimes(start=0.0, round_end=round_end, rewards_done=self.rewards_done, end=end, sync_s=self.sync_s,
                         train_spans=tuple(self.train_spans))

    def launched(self, request_id: str, at: float, prompt: int, request: GenerationRequest,
                 resumes: tuple[str, ...]) -> None:
        """A request went to the engine `at` seconds into the step."""
        self.intervals[request_id] = Interval(request_id, at, prompt=prompt, request=request, resumes=resumes)
        self.occupancy.change(at, +1)

    def answered(self, result: GenerationResult, at: float) -> None:
        """The engine answered a request `at` seconds into the step (finished or aborted)."""
        self.occupancy.change(at, -1)
        interval = self.intervals.get(result.request_id)
        if interval is not None:
            interval.end = at
            interval.outcome = "aborted" if result.finish_reason == "abort" else "wasted"
            interval.num_tokens, interval.finish_reason = len(result.token_ids), result.finish_reason
            interval.token_ids = result.token_ids
            interval.way_back_s, interval.way_in_s = result.way_back_s, result.way_in_s

    def trained_jobs(self, jobs: Sequence[TrainerRan]) -> None:
        """What the train worker finished: micro-batch statistics, and when it trained (the timeline's
        training lane; exporting weights is sync time, not training)."""
        for job in jobs:
            if job.micro_batch is not None:
                self.train_stats.append(job.stats)
            if job.micro_batch is not None or job.what == OPTIMIZER_STEP:
                self.train_spans.append((job.start - self.start, job.end - self.start, job.what))

    def settle_outcomes(self) -> None:
        """A sample scored but not trained this step is carried (a later step trains it) or wasted
        (its prompt was deferred): the timeline then agrees with the step's kept tokens."""
        for interval in self.intervals.values():
            if interval.outcome == "kept" and not interval.is_trained:
                interval.outcome = "carried" if interval.request_id in self.carried else "wasted"

    def record(self, end: float, capacity: int, sample_rewards: dict[str, float], ledger: EpochLedger,
               pending: frozenset[PromptKey]) -> dict:
        """The step's metrics record (`core.step_record`), the step ending `end` seconds after its start;
        `sample_rewards` by request id (its groups' rewards, a carried sample's included)."""
        rewards = self.trained_rewards
        spreads = [max(r) - min(r) for r in ([sample_rewards[i] for i in g] for g in self.groups) if r]
        loss_sum = sum(s.loss_sum for s in self.train_stats)
        tokens = sum(s.num_tokens for s in self.train_stats)
        entropy = sum(s.entropy_sum for s in self.train_stats)
        waits = self.reward_waits
        ended = [i for i in self.intervals.values() if i.finish_reason]
        return step_record(
            self.report, self.times(end), self.occupancy, capacity,
            mean_reward=sum(rewards) / len(rewards) if rewards else 0.0,
            reward_failures=self.failed_rewards,
            reward_wait_s_mean=sum(waits) / len(waits) if waits else 0.0,
            reward_wait_s_max=max(waits, default=0.0),
            nonzero_variance_groups=sum(1 for s in spreads if s > 0) / len(spreads) if spreads else 0.0,
            loss=loss_sum / tokens if tokens else 0.0,
            trained=[str(k) for k in self.trained],
            pending_prompts=len(pending),
            duplicate_prompts=ledger.duplicates,
            entropy=entropy / tokens if tokens else 0.0,
            train_forwards=sum(s.forwards for s in self.train_stats),
            train_padded_tokens=sum(s.padded_tokens for s in self.train_stats),
            grad_norm=self.step_stats.grad_norm if self.step_stats is not None else None,
            requests=[[i.prompt, i.num_tokens, i.finish_reason, i.request_id, i.reward] for i in ended],
            request_spans=[[round(i.start, 4), round(i.end, 4)] for i in ended],
            train_spans=[[round(a, 4), round(b, 4), what] for a, b, what in self.train_spans],
            abort_calls=[[round(at, 4), count] for at, count in self.abort_calls],
            ways_back=[rounded(i.way_back_s) for i in ended],
            ways_in=[rounded(i.way_in_s) for i in ended],
        )


def rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 4)
