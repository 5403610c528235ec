"""Part 2 of benchmarks/sim_vs_real.py, the live path's terms: fitted on the fit run's rounds beside their
prediction (`with_live_term`), or again from a kept result's own measurements after a change to the latency
model's terms (`refit`)."""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import tempfile
from pathlib import Path

import attrs
from sim_vs_real_calibrate import shared_prefill
from sim_vs_real_predict import Workload, instances_of, predict
from sim_vs_real_report import streams_training

from rollpacker.sim.engine_profile import (EngineProfile, Run, fit_abort, fit_event_s, fit_live_terms, fit_profile,
                                           fit_return_s)


PROBE_S = 1e-3
"""The step_s and launch_s of the fit's probe predictions: the seconds each adds to a round, over it, are the
round's decode steps and its launch waits."""


def with_live_term(args, profile: EngineProfile, out: Path, fit_records: list[dict], stages: dict,
                   micro_batch_tokens: int) -> EngineProfile:
    """The profile with the live path's extra time fitted on the fit runs' rounds (beside their prediction
    without it), saved as `out`/profile.json: first the abort latency, measured on the rounds that recorded their
    aborts (`with_live_aborts`), then, where training waits for the round (colocated), `fit_time_terms`
    and `return_s` an answer's way back: measured by the servers where the rounds recorded it
    (`measured_way_back`), else, on SGLang where the fit rounds differ in their finished requests, fitted on the
    rounds' generated tokens (the requests decode on while an answer travels; the time terms fitted again with
    it); `event_s` alone where the trainer trains beside the rollout (its
    micro-batches follow the finished requests).  `fit_records`: the fit runs' steps, one run after another
    (`fit_runs`)."""
    runs = fit_runs(args, fit_records)

    def fit(candidate: EngineProfile) -> list[dict]:
        return predict_fit_runs(args, runs, candidate, out / "profile.json", stages, micro_batch_tokens)

    rounds = after_warmup(runs)
    measured = [r["rollout_s"] for r in rounds]
    profile = with_live_aborts(profile, live_aborts(rounds, instances_of(args)))
    if streams_training(args):
        plain = [g["rollout_s"] for g in fit(attrs.evolve(profile, launch_s=0.0, step_s=0.0, event_s=0.0))]
        profile = attrs.evolve(profile, step_s=0.0, launch_s=0.0, event_s=fit_event_s(
            list(zip(measured, map(finished, rounds))), plain))
    else:
        back = measured_way_back(rounds)
        if back is not None:
            profile = attrs.evolve(profile, return_s=back["median_s"], fit={**profile.fit, "ways_back": back})
        profile = fit_time_terms(args, profile, fit, measured, rounds)
        if back is None and args.engine == "sglang" and len({finished(r) for r in rounds}) > 1:
            tokens = {c: [g["generated_tokens"] for g in fit(attrs.evolve(profile, return_s=c))] for c in RETURNS}
            returned = fit_return_s([sum(q[1] for q in r["requests"]) for r in rounds], tokens)
            profile = fit_time_terms(args, attrs.evolve(profile, return_s=returned), fit, measured, rounds)
    profile.save(out / "profile.json")
    return profile


def measured_way_back(rounds: list[dict]) -> dict | None:
    """The fit rounds' finished answers' ways back as their servers measured them (`ways_back`: SGLang started with
    --enable-metrics), their median the profile's `return_s`: {"median_s", "p90_s", "answers"}; None where the
    rounds have none (then the way back is fitted on the rounds' generated tokens)."""
    ways = sorted(way for r in rounds for way, q in zip(r.get("ways_back") or [], r["requests"])
                  if way is not None and q[2] != "abort")
    if not ways:
        return None
    return {"median_s": round(statistics.median(ways), 4), "p90_s": round(ways[math.ceil(0.9 * len(ways)) - 1], 4),
            "answers": len(ways)}


def live_aborts(rounds: list[dict], instances: int) -> list[tuple[int, float]]:
    """(requests caught on an instance, seconds from the abort call to the last aborted answer) of each fit round
    that sent one abort call and had requests come back aborted (`abort_calls`, `request_spans`; a tail round's
    several calls are left out: which answer follows which call is not recorded).  The requests caught are
    spread over the instances as the launches were (an even share, rounded up: the last answer is the fuller
    instance's)."""
    points = []
    for r in rounds:
        calls = r.get("abort_calls") or []
        ends = [end for q, (_, end) in zip(r["requests"], r.get("request_spans", [])) if q[2] == "abort"]
        if len(calls) == 1 and ends:
            points.append((math.ceil(len(ends) / instances), max(ends) - calls[0][0]))
    return points


def with_live_aborts(profile: EngineProfile, points: list[tuple[int, float]]) -> EngineProfile:
    """`profile` with its abort latency fitted on live rounds' `points` (`live_aborts`, kept in its fit as
    `live_aborts`) where they number 3 or more at 2 or more counts; else the calibration's, measured on idle
    aborts of one instance while any other stood idle (on SGLang here a live round's took twice as long)."""
    if len(points) < 3 or len({caught for caught, _ in points}) < 2:
        return profile
    fitted = fit_abort(points)
    return attrs.evolve(profile, abort_s=fitted["abort_s"], abort_request_s=fitted["abort_request_s"],
                        fit={**profile.fit, "live_aborts": [[c, round(s, 4)] for c, s in points]})


RETURNS = tuple(i * 0.01 for i in range(16))
"""The answer's way back (`return_s`) tried against the fit rounds' generated tokens: 0-150 ms."""


def fit_time_terms(args, profile: EngineProfile, fit, measured: list[float], rounds: list[dict]) -> EngineProfile:
    """`profile` with the live terms fitted by least squares on the fit `rounds`' `measured` rollout seconds, from
    `fit`'s predictions with none and with a probe of each: `launch_s` a launch (SGLang: the submission's way in),
    `step_s` a decode step (the driver sharing the engine's cores) and, where the rounds differ in their finished
    requests, `event_s` a finished request, and on SGLang where they differ in their launches, `submit_s` a
    launched request."""
    guesses, zero = [], {"launch_s": 0.0, "step_s": 0.0, "event_s": 0.0, "submit_s": 0.0}
    for probe in ({}, *({term: PROBE_S} for term in zero)):
        guesses.append([g["rollout_s"] for g in fit(attrs.evolve(profile, **{**zero, **probe}))])
    launches, steps, events, submits = ([(probed - plain) / PROBE_S for plain, probed in zip(guesses[0], g)]
                                        for g in guesses[1:])
    sglang = args.engine == "sglang"  # (the embedded engine is called in-process: no submission path to pay)
    live = fit_live_terms(measured, guesses[0], launches if sglang else [0.0] * len(launches), steps,
                          events if len({finished(r) for r in rounds}) > 1 else None,
                          submits if sglang and len({len(r["requests"]) for r in rounds}) > 1 else None)
    return attrs.evolve(profile, **{**zero, **live})


def fit_policy(args) -> str:
    """The fit runs' policies, comma-separated (a result measured before --fit-policy existed used sync)."""
    return getattr(args, "fit_policy", None) or "sync"


def fit_runs(args, fit_records: list[dict]) -> list[tuple[str, list[dict]]]:
    """(policy, its steps) of each fit run, from their steps one run after another, each tagged with its policy
    (a result measured before several fit runs: one run of `fit_policy`)."""
    return [(policy, list(steps)) for policy, steps in
            itertools.groupby(fit_records, key=lambda record: record.get("policy", fit_policy(args)))]


def predict_fit_runs(args, runs: list[tuple[str, list[dict]]], candidate: EngineProfile, profile_path: Path,
                     stages: dict, micro_batch_tokens: int) -> list[dict]:
    """The simulator's steps of the fit `runs` with the profile `candidate` (saved as `profile_path`), each run
    under its own policy, its warm-up left out: beside `after_warmup(runs)`."""
    workload, instances = Workload(args.fit_workload, args.fit_scale_from), instances_of(args)
    return [step for policy, records in runs
            for step in predict(args, profile_path, policy, 0, workload, len(records), stages, micro_batch_tokens,
                                instances, candidate)[1:]]


def after_warmup(runs: list[tuple[str, list[dict]]]) -> list[dict]:
    """The fit runs' steps but each run's first (a warm-up, left out on both sides)."""
    return [record for _, records in runs for record in records[1:]]


def finished(record: dict) -> int:
    """Requests of a step that finished (not aborted)."""
    return sum(1 for q in record["requests"] if q[2] != "abort")


def fit_round(record: dict) -> dict:
    """What the live terms' fit reads of a fit run's step record (kept in the result), with its requests' launches
    and answers (`request_spans`), its abort calls (`abort_calls`) and its answers' ways back (`ways_back`) where
    the run recorded them: the live rounds' abort latency (`live_aborts`) and way back (`measured_way_back`)."""
    return {"rollout_s": record["rollout_s"], "requests": [q[:3] for q in record["requests"]],
            **{key: record[key] for key in ("policy", "request_spans", "abort_calls", "ways_back", "ways_in")
               if key in record}}


def refit(result: dict, out: Path, forwards: bool = False) -> dict:
    """`result` with its profile fitted again by this tree's model from its own measurements: the calibration
    grid it kept, the decode steps it timed alone where it took them (`forwards`: also where it kept them unused,
    having chosen a line in rows) and the fit run's rounds it kept (a result measured before they were kept: the
    fit run's step records in `out`/fit), after a change to the latency model's terms."""
    args = argparse.Namespace(**result["args"])
    old = EngineProfile(**result["profile"])
    runs = [Run(*r) for r in old.fit["runs"]]
    profile = fit_profile(runs, engine=old.engine, model=old.model, machine=old.machine, date=old.date,
                          max_running=old.max_running, kv_capacity=old.kv_capacity, abort_s=old.abort_s,
                          abort_request_s=old.abort_request_s, aborts=old.fit.get("aborts"),
                          admit_fraction=old.admit_fraction, shared_prefill=shared_prefill(args),
                          attention_columns=old.attention_columns,
                          forwards=old.fit.get("forwards") or (old.fit.get("forwards_not_used") if forwards else None))
    records = result.get("fit_rounds") or [fit_round(json.loads(line))
                                           for line in (out / "fit" / "metrics.jsonl").read_text().splitlines()]
    profile = with_live_term(args, profile, Path(tempfile.mkdtemp(prefix="rollpacker-refit-")), records,
                           result["stages"], result["micro_batch_tokens"])
    return {**result, "profile": profile.to_dict(), "refit": True}
