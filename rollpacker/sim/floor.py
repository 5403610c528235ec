"""A floor under a step's rollout time that no policy, TP rule or batch can beat: the same for every
policy, so a table can show each one's distance from it.

Two bounds, the floor is the larger:

    work = kept tokens / fleet peak,   fleet peak = max over valid TP of (GPUs / TP) * B / (t0 + t1 * B)
    path = longest kept response * min over valid TP of (t0 + t1) * speculation's best slowdown

B is the engine's most running requests (`engine.max_running`); the context (t2) term and prefill
are left out of both, so both are lower than anything the latency model can produce.  The TPs are
those the model's heads allow and whose KV pool holds one request (core/tp_planner.feasible_tps).
Speculation is the engine's whatever the policy's setting (`spec.best_slowdown`, its best measured
acceptance), and it cannot raise the fleet's peak (at <= `spec.max_rows` rows a step yields at most
rows x (k + 1) tokens, far below B / (t0 + t1 B)), so only the path bound uses it.

Kept tokens count only what the step itself generated: tokens of a kept sample generated under an
older policy (a resumed partial response) were paid for in an earlier step.
"""

from __future__ import annotations

import attrs
from attrs import frozen

from rollpacker.core.cost_model import CostModel, Hardware, ModelShape
from rollpacker.core.tp_planner import feasible_tps

from .speculation import SpecConstants


@frozen
class Floor:
    tokens_per_s: float
    """The fleet's peak decode throughput at its best valid TP."""
    token_s: float
    """One lone request's fastest time per token (best valid TP, speculation at its best)."""

    def bound(self, kept_tokens: float, longest: float) -> tuple[float, float]:
        """(work, path) bounds of a step that keeps `kept_tokens`, the longest response `longest`."""
        return kept_tokens / self.tokens_per_s, longest * self.token_s


def engine_floor(model: ModelShape, hardware: Hardware, gpus: int, mem_fraction: float, max_context: int,
                 max_running: int, spec: SpecConstants) -> Floor:
    tps = feasible_tps(model, hardware, gpus, mem_fraction, max_context)
    costs = [CostModel(model=model, hardware=hardware, tp=tp, mem_fraction=mem_fraction) for tp in tps]
    peak = max((gpus // c.tp) * c.peak_tokens_per_s(max_running) for c in costs)
    spec = attrs.evolve(spec, enabled=True)
    alone = min((c.t0 + c.t1) * spec.best_slowdown(c) for c in costs)
    return Floor(peak, alone)


def profile_floor(profile, instances: int) -> Floor:
    """The floor of `instances` engines of a fitted profile (`engine_profile.EngineProfile`): its peak at
    `max_running` rows, and one request alone at t0 + t1 a token (one TP, no speculation)."""
    cost = profile.cost()
    return Floor(instances * cost.peak_tokens_per_s(profile.max_running), cost.t0 + cost.t1)
