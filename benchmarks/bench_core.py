"""The core's own cost: time per event and per planned step at 4,096 requests (targets: <= 10 us per
event, <= 50 ms per 4,096-request step), played through the real `driver.Driver`.

    .venv/bin/python benchmarks/bench_core.py [--profile]

A step = begin_round (plan and launch 4,096 requests: P=512 x R=8) + one RequestFinished per request
(random order) + one scorer answer per kept sample, fed by `Driver` from a fake backend on a
`VirtualClock` (the scorings go through the core's reward scheduler, as in live runs).  Per event it
prints the time inside the core (Scheduler calls) and the whole loop's (core + driver + the fake
backend's bookkeeping).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import time

from rollpacker.core import RequestAborted, RequestFinished, Scheduler, make_policy
from rollpacker.driver import Driver, ScorerAnswered, StepBegun, VirtualClock


class BenchBackend:
    """Answers in a fixed random order: the step's first launches shuffled, taken from the end of the
    queue; relaunches and scorer answers join its front, aborts its end."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.clock = VirtualClock()
        self.queue: list = []
        self.alive: set[str] = set()
        self.events = 0
        self.plan_s = 0.0
        self.started = 0.0

    def launch(self, commands) -> None:
        first = not self.alive and not self.queue
        answers = [RequestFinished(c.request_id, self.rng.randint(1, 8192), "stop", 1.0) for c in commands]
        self.alive.update(c.request_id for c in commands)
        if first:
            self.rng.shuffle(answers)
            self.queue = answers
        else:
            self.queue[:0] = answers

    def abort(self, request_ids) -> None:
        self.queue += [RequestAborted(rid, 10, 1.5) for rid in request_ids if rid in self.alive]

    def start_scoring(self, command) -> None:
        self.queue.insert(0, ScorerAnswered(command.request_id, self.rng.random()))

    def set_tensor_parallel(self, command) -> None: ...

    def train(self, command) -> None: ...

    def step_optimizer(self, command) -> None: ...

    def wait(self) -> list:
        while True:
            item = self.queue.pop()
            if isinstance(item, ScorerAnswered):
                self.clock.advance_to(2.0)
                break
            if item.request_id in self.alive:  # (else its other answer, finish vs abort, came first)
                self.alive.discard(item.request_id)
                self.clock.advance_to(item.at)
                break
        self.events += 1
        return [item]

    def observe(self, notice) -> None:
        if isinstance(notice, StepBegun):
            self.plan_s = time.perf_counter() - self.started

    def finish_step(self, ledger, pending) -> dict:
        return {}


def timed(method, spent: list):
    """`method`, adding its seconds to spent[0]; a call made inside another timed one (the Scheduler
    hands a settled reward to its own `handle`) is not counted twice (spent[1]: the depth)."""
    def run(*args, **kwargs):
        spent[1] += 1
        t = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            spent[1] -= 1
            if not spent[1]:
                spent[0] += time.perf_counter() - t
    return run


def one_step(policy: str, prompts: int, samples: int, seed: int) -> tuple[float, float, float, int, float]:
    """(seconds in begin_round, seconds in the core's event calls, seconds of the whole event loop, events,
    seconds of those core calls in the reward scheduler)"""
    sched = Scheduler(make_policy(policy, prompts=prompts, samples=samples, max_tokens=8192), num_prompts=4 * prompts,
                      seed=seed)
    core, rewards = [0.0, 0], [0.0, 0]
    for name in ("handle", "start_scoring", "scoring_finished", "expire_rewards"):
        setattr(sched, name, timed(getattr(sched, name), core))
    for name in ("submit", "finished", "expire"):
        setattr(sched.rewards, name, timed(getattr(sched.rewards, name), rewards))
    backend = BenchBackend(random.Random(seed))
    driver = Driver(sched, backend, backend.clock)
    backend.started = time.perf_counter()
    driver.run_step()
    loop_s = time.perf_counter() - backend.started - backend.plan_s
    assert sched.step_done
    return backend.plan_s, core[0], loop_s, backend.events, rewards[0]


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
        per_event = min(r[1] / r[3] for r in runs)
        loop_per_event = min(r[2] / r[3] for r in runs)
        planner_per_event = min((r[1] - r[4]) / r[3] for r in runs)
        step = min(r[0] + r[1] for r in runs)
        print(f"{policy:7s} P={prompts} R=8: begin_round {plan * 1e3:.1f} ms, {per_event * 1e6:.1f} us/event "
              f"in the core ({planner_per_event * 1e6:.1f} outside the reward scheduler), "
              f"{loop_per_event * 1e6:.1f} us/event through the driver ({runs[0][3]} events), "
              f"whole step in the core {step * 1e3:.0f} ms")
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
