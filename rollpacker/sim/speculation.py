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
Speculation is on when b <= `max_rows` (the engine's own rule, `spec_max_rows`: 4 rows per
instance by default) and slowdown(b) < 1; the output distribution is the model's (lossless), so every token stays
on-policy.

Acceptance is measured, not assumed: `benchmarks/spec_acceptance.py` generated groups of the default
tasks to completion with SmolLM2-135M-Instruct and replayed the engine's own n-gram drafter over
them (rollpacker/data/spec_acceptance.json, which records its command and sizes).  The simulator
reads its accepted drafts per verify step (a verify that found no draft counts 0) by the share of a
running request's siblings that have finished (their text is what the drafter copies from;
`siblings.SiblingTexts` defines it, with `carry_drafts` the texts of earlier rounds), at the
longest cap measured, so E = 1 + accepted(share).  `--set spec.acceptance=A` replaces the table with a
constant per-token rate A and the independent-acceptance estimate above: an assumption, as is
applying a 135M model's table to a 7B-32B model's answers of up to 32k tokens (longer answers and
larger models repeat themselves differently; the papers report 2-4 tokens per verify step for
theirs, above what we measured).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import ClassVar

import attrs
from attrs import field, frozen

from rollpacker.core.cost_model import CostModel
from rollpacker.core.errors import ConfigError
from rollpacker.core.validators import field_name, non_negative

TABLE = Path(__file__).resolve().parents[1] / "data" / "spec_acceptance.json"
MEASURED = -1.0
"""`acceptance` value that selects the measured table."""


def _rate(instance, attribute, value) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not (0.0 <= value < 1.0 or value == MEASURED):
        raise ConfigError(f"{field_name(instance, attribute)} must be a number in [0, 1) (or {MEASURED}: the measured "
                          f"table), got {value!r}")


@frozen
class AcceptanceTable:
    draft_tokens: int
    """k of the measurement (the engine's spec_tokens)."""
    buckets: tuple[tuple[float, float, float], ...]
    """(finished-sibling share from, to, accepted drafts per verify step)."""

    def accepted(self, share: float) -> float:
        for lo, hi, value in self.buckets:
            if lo <= share < hi:
                return value
        return self.buckets[-1][2] if share >= self.buckets[-1][0] else self.buckets[0][2]


@functools.cache
def measured_table(path: Path = TABLE) -> AcceptanceTable:
    """The table of benchmarks/spec_acceptance.py at its longest cap (one clear error if it is missing)."""
    try:
        data = json.loads(Path(path).read_text())
        cap = max(data["caps"], key=int)
        rows = data["caps"][cap]["by_finished_share"]
        buckets = tuple((float(r["from"]), float(r["to"]), float(r["accepted_per_verify"])) for r in rows
                        if r["accepted_per_verify"] is not None)
        return AcceptanceTable(int(data["spec_tokens"]), buckets)
    except (OSError, KeyError, ValueError, TypeError) as exc:
        raise ConfigError(f"{path}: cannot read the measured acceptance table ({exc}); regenerate it with "
                          "benchmarks/spec_acceptance.py or --set spec.acceptance=RATE") from None


@frozen(kw_only=True)
class SpecConstants:
    section: ClassVar[str] = "spec"
    """Its field of SimConstants: errors name a constant as `--set` does (spec.NAME)."""

    enabled: bool = False
    """Model speculative decoding in the tail (`--set spec.enabled=true`, or ours-best)."""
    acceptance: float = field(default=MEASURED, validator=_rate)
    """-1: the measured table (accepted drafts per verify by finished-sibling share); a rate in [0, 1):
    a constant per-token acceptance (an assumption, replayed with the independent-acceptance estimate)."""
    draft_tokens: int = field(default=4, validator=non_negative)
    """k: tokens drafted per row and verify step (the embedded engine's `spec_tokens` default)."""
    max_rows: int = field(default=4, validator=non_negative)
    """Speculate only when at most this many requests run on the instance: the embedded engine's own
    rule, `spec_max_rows`, 4 on a GPU (`SPEC_MAX_ROWS_CUDA`)."""
    carry_drafts: bool = True
    """A request's finished siblings include its prompt's requests that finished in earlier rounds
    since the prompt was drawn (the short round that deferred it), until the prompt is trained: the
    embedded engine keeps those groups' text for it (`DraftKeepingEngine`).  False: only this
    round's (`siblings.SiblingTexts` defines the share)."""

    def __attrs_post_init__(self) -> None:
        if self.acceptance == MEASURED and self.draft_tokens not in (0, measured_table().draft_tokens):
            raise ConfigError(f"spec.draft_tokens {self.draft_tokens}: the measured acceptance table is for "
                              f"{measured_table().draft_tokens} drafts; set spec.acceptance=RATE to model another k")

    def accepted_per_step(self, share: float = 0.0) -> float:
        """Tokens a row emits per verify step (accepted drafts + 1), `share` of its siblings finished."""
        if self.acceptance == MEASURED:
            return 1.0 + measured_table().accepted(share)
        a, k = self.acceptance, self.draft_tokens
        return (1.0 - a ** (k + 1)) / (1.0 - a) if a > 0 else 1.0

    def slowdown(self, cost: CostModel, batch: int, share: float = 0.0) -> float:
        """Time per generated token with speculation relative to plain decode (1.0: off)."""
        if not self.enabled or batch < 1 or batch > self.max_rows or self.draft_tokens == 0:
            return 1.0
        verify = (cost.t0 + cost.t1 * batch * (self.draft_tokens + 1)) / (cost.t0 + cost.t1 * batch)
        return min(1.0, verify / self.accepted_per_step(share))

    def best_slowdown(self, cost: CostModel) -> float:
        """The lowest slowdown speculation reaches on this engine (one row, its best measured share),
        whether or not it is on."""
        on = attrs.evolve(self, enabled=True, max_rows=max(self.max_rows, 1))
        if self.acceptance != MEASURED:
            return on.slowdown(cost, 1)
        return min(on.slowdown(cost, 1, lo) for lo, _, _ in measured_table().buckets)
