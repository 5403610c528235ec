"""One step of a live run as the driver records it: each request's `Interval` on the step's
timeline (what the engine was asked, what it answered, whether its sample was kept, scored, trained)
and the step's `StepLog` (rewards, trained samples, when the trainer trained, time spent syncing)."""

from __future__ import annotations

from typing import Any

from attrs import define, field

from rollpacker.core.metrics import Occupancy, StepTimes
from rollpacker.core.protocols import GenerationRequest


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
    rewards_done: float = 0.0
    """When the last reward answer the step waited for came, seconds from the step's start."""
    stepped: bool = False
    """The optimizer has stepped: a reward answered since (a carried sample's, fed with the answer that
    completed the step) is no wait of this step's."""
    sync_s: float = 0.0
    train_stats: list = field(factory=list)
    step_stats: Any = None

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
