"""Speculative decoding in the tail (Seer arXiv 2511.14617, TLT arXiv 2511.16665, DAS arXiv 2511.13841):
lossless draft-and-verify switched on only when an instance's running batch is small.

Theory of operation
-------------------
Decode is memory-bound at small batch: a step costs t0 + t1 * b (+ context), with t0 (reading the
weights) dominating.  Verifying k drafted tokens per row costs one step over b * (k + 1) query rows
and yields, per row, the accepted prefix plus one token: E = (1 - a^(k+1)) / (1 - a) tokens for a
per-token acceptance rate a (drafts accepted independently, the standard speculative-sampling
estimate).  So a token costs

    slowdown(b) = (t0 + t1 * b * (k + 1)) / (t0 + t1 * b) / E

times a plain decode token.  The context term (t2 * C) is left out of both sides: attention reads
the KV cache once per verify step, so leaving it out overstates the verify cost (conservative).
Speculation is on when b <= `max_rows` and slowdown(b) < 1 (TLT / DAS switch it on only when the
running batch is small); the output distribution is the model's (lossless), so every token stays
on-policy.

The acceptance rate is the embedded engine's, measured (`ACCEPTANCE`); another engine's measured
`speculation_stats` may replace it: `--set spec.acceptance=0.6`.
"""

from __future__ import annotations

import attrs
from attrs import field, frozen

from rollpacker.core.cost_model import CostModel
from rollpacker.core.errors import ConfigError


def _rate(instance, attribute, value) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value < 1.0:
        raise ConfigError(f"spec.{attribute.name} must be a number in [0, 1), got {value!r}")


def _count(instance, attribute, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"spec.{attribute.name} must be an integer >= 0, got {value!r}")


ACCEPTANCE = 0.55
"""Per-token acceptance of sibling / n-gram drafts, measured: the embedded engine on real rollouts of
the default tasks (SmolLM2-135M-Instruct, temperature 1, groups of 4, 4 drafts, one running row;
`benchmarks/spec_decode.py`, RESULTS.md "Speculative decoding in the tail") accepted 1.27 drafts
per verify step with finished siblings to draft from (one running row: a + a^2 + a^3 + a^4 = 1.27
gives a = 0.59), and 0.1-0.27 with every sibling of the group still running (4-16 rows).  A long
round's tail is the first case (most siblings have finished), so 0.55 (1.11 accepted per verify
step, 2.11 tokens) stands a little below that measured figure.  The cited papers report 2-4 tokens
per verify step for larger models and longer answers (Seer, grouped SD; TLT / DAS)."""


@frozen(kw_only=True)
class SpecConstants:
    enabled: bool = False
    """Model speculative decoding in the tail (`--set spec.enabled=true`, or ours-best)."""
    acceptance: float = field(default=ACCEPTANCE, validator=_rate)
    """Per-token acceptance rate of a drafted token."""
    draft_tokens: int = field(default=4, validator=_count)
    """k: tokens drafted per row and verify step (the embedded engine's `spec_tokens` default)."""
    max_rows: int = field(default=32, validator=_count)
    """Speculate only when at most this many requests run on the instance (assumption: TLT / DAS
    enable it for small batches; the embedded engine's `spec_max_rows` is 4 on CPU)."""

    def accepted_per_step(self) -> float:
        a, k = self.acceptance, self.draft_tokens
        return (1.0 - a ** (k + 1)) / (1.0 - a) if a > 0 else 1.0

    def slowdown(self, cost: CostModel, batch: int) -> float:
        """Time per generated token with speculation relative to plain decode (1.0: off)."""
        if not self.enabled or batch < 1 or batch > self.max_rows or self.draft_tokens == 0:
            return 1.0
        verify = (cost.t0 + cost.t1 * batch * (self.draft_tokens + 1)) / (cost.t0 + cost.t1 * batch)
        return min(1.0, verify / self.accepted_per_step())

    def best_slowdown(self, cost: CostModel) -> float:
        """The lowest slowdown speculation reaches on this engine (one row), whether or not it is on."""
        return attrs.evolve(self, enabled=True, max_rows=max(self.max_rows, 1)).slowdown(cost, 1)
