"""What an importer reads from a user's log, whatever its format: per-sample lengths (tier 1) or per-step
length scalars (tier 2), the step times found beside them, and what had to be assumed or skipped."""

from __future__ import annotations

from attrs import field, frozen

from rollpacker.core.errors import ConfigError


class AdviseError(ConfigError):
    """A log `rollpacker advise` cannot use: one line naming what is missing and how to give it."""


@frozen
class Sample:
    """One trajectory of a per-sample dump: its step, its group (siblings of one prompt), and its length
    as the log gives it: a token count, or the decoded text to re-tokenize (EOS stripped)."""

    step: int
    group: str
    prompt: str | None = None
    """The prompt's text (for its token count), where the dump has it."""
    output: str | None = None
    tokens: int | None = None
    prompt_tokens: int | None = None
    reason: str | None = None
    """"stop" or "length" where the log says; else decided against the cap."""


@frozen
class Group:
    """One prompt's samples in one step: the simulator's workload line."""

    step: int
    prompt: str
    lengths: tuple[int, ...]
    reasons: tuple[str, ...]
    prompt_tokens: int | None = None

    def line(self) -> dict:
        """The simulator's workload line (rollpacker/sim/workloads.py)."""
        line = {"step": self.step, "prompt": self.prompt, "lengths": list(self.lengths),
                "finish_reasons": list(self.reasons)}
        return line | ({"prompt_tokens": self.prompt_tokens} if self.prompt_tokens else {})


@frozen
class StepScalars:
    """One step's length scalars (tier 2): what the training loggers write."""

    step: int
    mean: float
    max: float | None = None
    min: float | None = None
    clip_ratio: float | None = None
    prompt_mean: float | None = None


@frozen
class StepTimes:
    """One step's measured times, where the log has them (seconds)."""

    step: int
    gen_s: float | None = None
    """The rollout's generation (veRL timing_s/gen, TRL's generate profiling time, our rollout_s)."""
    step_s: float | None = None
    agent_max: float | None = None
    """veRL's agent loop: the slowest and the mean sample's generation time in the step."""
    agent_mean: float | None = None


@frozen(kw_only=True)
class ImportedLog:
    """A log read by one importer.  Exactly one of `samples` (tier 1) and `scalars` (tier 2) is non-empty."""

    source: str
    """The format's name (verl, trl, ...) and what was read."""
    samples: tuple[Sample, ...] = ()
    scalars: tuple[StepScalars, ...] = ()
    times: tuple[StepTimes, ...] = ()
    max_tokens: int | None = None
    """The response cap where the log states it."""
    prompts: int | None = None
    """P and R where the log states them (tier 2 needs them)."""
    samples_per_prompt: int | None = None
    notes: tuple[str, ...] = field(factory=tuple)
    """Rows skipped and why, values assumed: printed with the advice."""

    @property
    def tier(self) -> int:
        return 1 if self.samples else 2

    @property
    def steps(self) -> list[int]:
        return sorted({s.step for s in self.samples} if self.samples else {s.step for s in self.scalars})
