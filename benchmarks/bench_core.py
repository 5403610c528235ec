"""The core's own cost: time per event and per planned step at 4,096 requests (targets: <= 10 us per
event, <= 50 ms per 4,096-request step).

    .venv/bin/python benchmarks/bench_core.py [--profile]

A step = begin_round (plan and launch 4,096 requests: P=512 x R=8) + one RequestFinished per request
(random order) + one RewardScored per kept sample, through the Scheduler (planner + stream batcher).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import time

from rollpacker.core import (
    LaunchRequest,
    RequestAborted,
    RequestFinished,
    RewardScored,
    ScoreSample,
    AbortRequest,
    Scheduler,
    make_policy,
)


def one_step(policy: str, prompts: int, samples: int, seed: int) -> tuple[float, float, int]:
    """(seconds in begin_round, seconds in handle, events handled)"""
    sched = Scheduler(make_policy(policy, prompts=prompts, samples=samples, max_tokens=8192), num_prompts=4 * prompts,
                      seed=seed)
    rng = random.Random(seed)
    t = time.perf_counter()
    commands = sched.begin_round()
    plan_s = time.perf_counter() - t
    running = [c.request_id for c in commands if isinstance(c, LaunchRequest)]
    rng.shuffle(running)
    handle_s, events = 0.0, 0
    queue = [RequestFinished(rid, rng.randint(1, 8192), "stop", 1.0) for rid in running]
    alive = set(running)
    while queue and not sched.step_done:
        event = queue.pop()
        if getattr(event, "request_id", None) in alive:
            alive.discard(event.request_id)
        elif not isinstance(event, RewardScored):
            continue
        t = time.perf_counter()
        out = sched.handle(event)
        handle_s += time.perf_counter() - t
        events += 1
        for c in out:
            if isinstance(c, ScoreSample):
                queue.insert(0, RewardScored(c.sample.request_id, rng.random(), False, 2.0))
            elif isinstance(c, AbortRequest) and c.request_id in alive:
                queue.append(RequestAborted(c.request_id, 10, 1.5))
            elif isinstance(c, LaunchRequest):
                alive.add(c.request_id)
                queue.insert(0, RequestFinished(c.request_id, rng.randint(1, 8192), "stop", 1.0))
    assert sched.step_done
    return plan_s, handle_s, events


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    for policy, prompts in (("sync", 512), ("tail", 410), ("sorted", 512)):
        if args.profile:
            cProfile.runctx("one_step(policy, prompts, 8, 0)", globals(), locals(), "/tmp/core.prof")
            pstats.Stats("/tmp/core.prof").sort_stats("tottime").print_stats(12)
        runs = [one_step(policy, prompts, 8, seed) for seed in range(3)]
        plan = min(r[0] for r in runs)
        per_event = min(r[1] / r[2] for r in runs)
        step = min(r[0] + r[1] for r in runs)
        print(f"{policy:7s} P={prompts} R=8: begin_round {plan * 1e3:.1f} ms, {per_event * 1e6:.1f} us/event "
              f"({runs[0][2]} events), whole step in the core {step * 1e3:.0f} ms")
    print(f"simulator: one 32k step of 128 x 8 on 16 TP4 instances (64 GPUs) in {sim_step_s():.2f} s (target < 2 s)")


def sim_step_s() -> float:
    from rollpacker.sim import SimConfig, Simulation

    config = SimConfig(policy="sync", prompts=128, samples=8, max_tokens=32768, steps=1, instances=16, tp=4,
                       model="qwen2.5-32b", dataset_prompts=128)
    best = float("inf")
    for _ in range(3):
        sim = Simulation(config)
        t = time.perf_counter()
        sim.run()
        best = min(best, time.perf_counter() - t)
    return best


if __name__ == "__main__":
    main()
