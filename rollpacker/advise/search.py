"""The runs behind the advice: sync and each policy with a few knob settings, over seeds (and, in tier
2, over the assumed prompt structure), each an epoch of the workload (every prompt trained once,
nothing pending: rollpacker/sim/compare.py), compared to sync run for run."""

from __future__ import annotations

import multiprocessing
import os

import numpy as np
from attrs import frozen

from rollpacker.core import ConfigError, knob_specs
from rollpacker.sim import SimConfig, SimConstants
from rollpacker.sim.compare import ROLLOUT, STEP, kept_length_ratios, ratios, run_totals

CANDIDATES = (
    ("sync", "sync", {}),
    ("tail", "tail", {}),
    ("tail, 1.5 x prompts", "tail", {"eta_prompts": 1.5}),
    ("tail, unbiased groups", "tail", {"eta_responses": 1.0}),
    ("tail, 1.5 x prompts, unbiased", "tail", {"eta_prompts": 1.5, "eta_responses": 1.0}),
    ("sorted", "sorted", {}),
    ("partial", "partial", {}),
)
"""(label, policy, knobs): the paper's settings and a small search over tail batching's two knobs."""


@frozen
class Candidate:
    label: str
    policy: str
    knobs: dict

    def flags(self) -> str:
        """The flags that run it (the reference trainer and `rollpacker simulate` read both)."""
        specs = {k.name: k for k in knob_specs(self.policy)}
        knobs = " ".join(f"--{self.policy}.{specs[name].flag} {value}" for name, value in self.knobs.items())
        return f"--policy {self.policy}" + (f" {knobs}" if knobs else "")


def candidates() -> list[Candidate]:
    out = []
    for label, policy, knobs in CANDIDATES:
        names = {k.name for k in knob_specs(policy)}
        if set(knobs) - names:
            raise ConfigError(f"advise candidate {label!r}: {policy} has no knob {sorted(set(knobs) - names)}")
        out.append(Candidate(label, policy, knobs))
    return out


@frozen
class Outcome:
    """One candidate over every run (seeds x workload variants), ratios against sync run for run."""

    candidate: Candidate
    step_gain: tuple[float, ...]
    rollout_gain: tuple[float, ...]
    wasted: tuple[float, ...]
    kept_length: tuple[float, ...]
    on_policy: tuple[float, ...]
    step_s: tuple[float, ...]
    rollout_s: tuple[float, ...]

    def to_dict(self) -> dict:
        return {"label": self.candidate.label, "flags": self.candidate.flags(),
                **{k: list(getattr(self, k)) for k in ("step_gain", "rollout_gain", "wasted", "kept_length",
                                                      "on_policy", "step_s", "rollout_s")}}


def _job(job):
    key, config, constants = job
    return key, run_totals(config, constants, None)


def run_search(configs: dict, constants: SimConstants, jobs: int, progress=None) -> dict:
    """`configs`: key -> SimConfig; the totals of each (in a pool of `jobs` processes)."""
    work = [(key, config, constants) for key, config in configs.items()]
    results = {}
    if jobs <= 1:
        stream = map(_job, work)
    else:
        pool = multiprocessing.get_context("fork" if os.name == "posix" else "spawn").Pool(jobs)
        stream = pool.imap_unordered(_job, work)
    try:
        for key, totals in stream:
            results[key] = totals
            if progress is not None:
                progress.update(1)
    finally:
        if jobs > 1:
            pool.close()
            pool.join()
    return results


def search_configs(base: SimConfig, workloads: list[str], seeds: list[int]) -> dict:
    """(candidate label, workload, seed) -> its SimConfig."""
    import attrs

    return {(c.label, w, seed): attrs.evolve(base, workload=w, policy=c.policy, knobs=c.knobs, seed=seed)
            for c in candidates() for w in workloads for seed in seeds}


def outcomes(results: dict, workloads: list[str], seeds: list[int]) -> list[Outcome]:
    runs_of = {c.label: [results[(c.label, w, s)] for w in workloads for s in seeds] for c in candidates()}
    sync = runs_of["sync"]
    out = []
    for c in candidates():
        runs = runs_of[c.label]
        out.append(Outcome(
            c, tuple(ratios(runs, sync, STEP)), tuple(ratios(runs, sync, ROLLOUT)),
            tuple(t["wasted_tokens"] / t["generated_tokens"] for t in runs), tuple(kept_length_ratios(runs, sync)),
            tuple(t["on_policy_fraction"] for t in runs), tuple(t[STEP] for t in runs), tuple(t[ROLLOUT] for t in runs)))
    return out


ON_POLICY = 0.999
MIN_GAIN = 1.05
"""Below a 5% whole-step gain (median) the advice is to keep sync."""


def recommend(results: list[Outcome]) -> Outcome | None:
    """The on-policy candidate with the best median whole-step gain; None when none gains MIN_GAIN."""
    fair = [o for o in results if o.candidate.policy != "sync" and min(o.on_policy) >= ON_POLICY]
    best = max(fair, key=lambda o: float(np.median(o.step_gain)), default=None)
    return best if best is not None and float(np.median(best.step_gain)) >= MIN_GAIN else None
