"""What the driver tells an observer: the `Notice`s, the `Observer` it tells them to, and
`NoticeObserver`, the base that routes each notice to the method named for its type.

Nothing in a notice is to be executed: it says what the core decided or what the driver is doing, for
an observer that records a step (the live backend's step log, the simulator's meter, a test harness)."""

from __future__ import annotations

from typing import ClassVar, Protocol

from attrs import frozen

from rollpacker.core import CloseGroup, Command, EndRound, EpochLedger, RewardScored, ScoreSample
from rollpacker.core.records import PromptKey


@frozen
class StepBegun:
    """A step starts; `commands` are its round's first (not yet executed)."""

    commands: tuple[Command, ...]


Notice = StepBegun | ScoreSample | RewardScored | CloseGroup | EndRound
"""What the driver tells its observer; nothing in a notice is to be executed."""


class Observer(Protocol):
    """What the driver tells, and the step's record it asks for once the optimizer has stepped."""

    def observe(self, notice: Notice) -> None:
        """`StepBegun`, then as they come: `ScoreSample` (before its scoring is queued: prepare the
        reward job), `RewardScored` (a timeout's included), `CloseGroup`, `EndRound`."""

    def finish_step(self, ledger: EpochLedger, pending: frozenset[PromptKey]) -> dict:
        """The step's metrics record (`core.step_record`), after its optimizer step."""


class NoticeObserver:
    """An `Observer` whose `observe` calls one method per notice type (`METHODS`); each does nothing
    unless a subclass overrides it.  Subclasses write `finish_step`."""

    METHODS: ClassVar[dict[type, str]] = {
        StepBegun: "begin_step",
        ScoreSample: "keep",
        RewardScored: "scored",
        CloseGroup: "close_group",
        EndRound: "end_round",
    }

    def observe(self, notice: Notice) -> None:
        method = self.METHODS.get(type(notice))
        if method is None:
            raise TypeError(f"{type(self).__name__}: no method for notice {notice!r}")
        getattr(self, method)(notice)

    def begin_step(self, notice: StepBegun) -> None:
        """A step starts."""

    def keep(self, notice: ScoreSample) -> None:
        """A sample is kept; its scoring is queued next."""

    def scored(self, notice: RewardScored) -> None:
        """The core settled a kept sample's reward (0 for a failure or a scoring its deadline cut)."""

    def close_group(self, notice: CloseGroup) -> None:
        """A group is complete."""

    def end_round(self, notice: EndRound) -> None:
        """The round ended (its tail aborted, its carried requests named)."""

    def finish_step(self, ledger: EpochLedger, pending: frozenset[PromptKey]) -> dict:
        raise NotImplementedError(f"{type(self).__name__}.finish_step")
