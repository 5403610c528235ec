"""Calibrating the simulated engine to a log's generation times, and the agent loop's spread.

The latency model's engine speed is scaled by one factor k (every bandwidth and FLOP rate times k, every
fixed cost over k: a decode step, a prefill and so the rollout take 1 / k the time; KV capacity is
unchanged), fitted so the simulated sync step's generation matches the log's mean (`timing_s/gen`,
TRL's generate time, our rollout_s) over the steps simulated.  The trainer is not calibrated."""

from __future__ import annotations

import attrs
import numpy as np

from rollpacker.core.cost_model import Hardware
from rollpacker.sim import SimConstants, Simulation

from .records import StepTimes


def scaled_hardware(h: Hardware, k: float) -> Hardware:
    """`h` with its engine k times as fast."""
    return attrs.evolve(
        h, bw_weights=h.bw_weights * k, bw_kv=h.bw_kv * k, flops=h.flops * k, flops_attn=h.flops_attn * k,
        tau_layer=h.tau_layer / k, tau_allreduce=h.tau_allreduce / k, tau_fixed=h.tau_fixed / k,
        allreduce_bw=tuple((tp, bw * k) for tp, bw in h.allreduce_bw))


def calibrated(constants: SimConstants, k: float) -> SimConstants:
    return attrs.evolve(constants, hardware=scaled_hardware(constants.hardware, k))


class TimedSimulation(Simulation):
    """A Simulation that keeps, per step, the slowest and the mean request's time from the step's start
    (sync launches the whole step at its start: a request's generation time)."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.request_spread: list[tuple[float, float]] = []

    def finish_step(self, ledger, pending) -> dict:
        times = np.asarray(self.meter.finish_times) - self.meter.start
        if len(times):
            self.request_spread.append((float(times.max()), float(times.mean())))
        return super().finish_step(ledger, pending)


def mean_of(times: list[StepTimes], field: str, steps: list[int]) -> float | None:
    """The mean of a time over the simulated steps where the log has it, else over every step that has it."""
    chosen = [getattr(t, field) for t in times if t.step in steps and getattr(t, field) is not None]
    every = [getattr(t, field) for t in times if getattr(t, field) is not None]
    values = chosen or every
    return float(np.mean(values)) if values else None


def agent_ratio(times: list[StepTimes]) -> float | None:
    """The log's median over steps of the slowest sample's generation time over the mean's."""
    ratios = [t.agent_max / t.agent_mean for t in times if t.agent_max and t.agent_mean]
    return float(np.median(ratios)) if ratios else None


def simulated_agent_ratio(sim: TimedSimulation) -> float | None:
    ratios = [top / mean for top, mean in sim.request_spread if mean > 0]
    return float(np.median(ratios)) if ratios else None
