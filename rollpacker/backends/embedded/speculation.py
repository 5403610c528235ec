"""Speculative decoding in the tail for the embedded engine: when few rows are running, each row
gets up to `num_tokens` draft tokens from `drafter.Drafter` (n-gram matches over its own
context and its sibling samples' responses: same prompt, same GRPO group), and one forward of
`num_tokens + 1` tokens per row verifies them (`sampling.verify`, the standard
speculative-sampling rule, so the output distribution is exactly the model's).

Why only in the tail: with many rows a decode step is bound by compute (CPU) or already uses the
GPU well, and a verify forward of k + 1 tokens per row costs nearly k + 1 steps' work; with few
rows a step is bound by reading the weights (and, on a GPU, by kernel launches), so verifying
k + 1 tokens costs about one step and every accepted draft is a step saved.  `max_rows` is that
threshold.

Drafts come from text generated under older weights too (a sibling that finished before a weight
update, a request of the same prompt in an earlier round): that is fine, a draft is only a
proposal and the current model's verification decides every emitted token.
"""

from __future__ import annotations

from collections.abc import Collection

from attrs import define

from rollpacker.backends.embedded.drafter import Drafter
from rollpacker.core.errors import ConfigError

SPEC_MAX_ROWS_CUDA = 4
"""The engine's default threshold on a GPU (on CPU speculation is off by default: measured no faster
there, `benchmarks/spec_decode.py`)."""


def speculation_rows(spec_max_rows: int | None, on_cuda: bool) -> int:
    """The engine's threshold for `spec_max_rows` (None: SPEC_MAX_ROWS_CUDA on CUDA, 0 (off) on CPU)."""
    if spec_max_rows is None:
        return SPEC_MAX_ROWS_CUDA if on_cuda else 0
    return spec_max_rows


@define(kw_only=True)
class SpeculationStats:
    """Counts since the engine started (or since `reset`)."""

    num_verify_steps: int = 0
    """Forwards that verified drafts."""
    num_row_verifies: int = 0
    """Rows verified, summed over those forwards."""
    num_drafted: int = 0
    """Draft tokens proposed."""
    num_accepted: int = 0
    """Draft tokens accepted."""

    @property
    def accepted_per_verify(self) -> float:
        """Mean accepted draft tokens per row and verify step (each also emits one more token)."""
        return self.num_accepted / self.num_row_verifies if self.num_row_verifies else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted / self.num_drafted if self.num_drafted else 0.0

    def as_dict(self) -> dict:
        return {"verify_steps": self.num_verify_steps, "row_verifies": self.num_row_verifies,
                "drafted": self.num_drafted, "accepted": self.num_accepted,
                "accepted_per_verify": round(self.accepted_per_verify, 3),
                "acceptance_rate": round(self.acceptance_rate, 3)}


class Speculator:
    """Drafts for the running rows when there are at most `max_rows` of them (0: off)."""

    def __init__(self, *, max_rows: int, num_tokens: int, ngram: int) -> None:
        if max_rows < 0:
            raise ConfigError(f"spec_max_rows must be >= 0, got {max_rows}")
        if not 1 <= num_tokens <= 32:
            raise ConfigError(f"spec_tokens must be in [1, 32], got {num_tokens}")
        if ngram < 1:
            raise ConfigError(f"spec_ngram must be >= 1, got {ngram}")
        self.max_rows = max_rows
        self.num_tokens = num_tokens
        self.drafter = Drafter(ngram=ngram, min_ngram=min(2, ngram))
        self.stats = SpeculationStats()

    @property
    def is_on(self) -> bool:
        return self.max_rows > 0

    def track(self, seq_id: str, group: str, tokens: list[int], num_prompt: int) -> None:
        if self.is_on:
            self.drafter.track(seq_id, group, tokens, num_prompt)

    def release(self, seq_id: str) -> None:
        if self.is_on:
            self.drafter.release(seq_id)

    def keep(self, groups: Collection[str]) -> None:
        """`Drafter.keep`: these groups' sources outlive any churn until a later call drops them."""
        self.drafter.keep(groups)

    def drafts(self, rows) -> list[list[int]] | None:
        """A draft per row (possibly empty), or None when this step should not speculate.
        Each row is (seq_id, most tokens it may still emit)."""
        if not self.is_on or len(rows) > self.max_rows:
            return None
        drafts = [self.drafter.propose(seq_id, min(self.num_tokens, room - 1)) if room > 1 else []
                  for seq_id, room in rows]
        return drafts if any(drafts) else None

    def record(self, num_drafts: list[int], num_accepted: list[int]) -> None:
        s = self.stats
        s.num_verify_steps += 1
        s.num_row_verifies += len(num_drafts)
        s.num_drafted += sum(num_drafts)
        s.num_accepted += sum(num_accepted)
