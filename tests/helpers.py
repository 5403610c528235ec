"""A random-order driver for the core: the test harness that plays engine and reward executor.

Each launched request gets a length drawn from its prompt's length (per-prompt effect plus noise)
and finishes at launch time + length / speed; an abort lands after a random delay (so a request may
finish before its abort arrives, as with a real engine).  Rewards arrive after random delays.  It
checks the Protocol obligations (one answer per request) as it goes.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter

from rollpacker.core import (
    AbortRequest,
    EndRound,
    LaunchRequest,
    RequestAborted,
    RequestFinished,
    RewardScored,
    Scheduler,
    ScoreSample,
    StepOptimizer,
    TrainMicroBatch,
)
from rollpacker.core.prompt_pool import COMPLETED, PromptPool, epoch_order
from rollpacker.core.records import PromptKey


def check_trained_exactly_once(pool: PromptPool, trained: list[PromptKey]) -> None:
    """Every key the pool has handed out is trained exactly once, or still to be trained (in
    flight, deferred or fresh again), whether or not it was ever launched; the keys trained from an
    epoch with nothing left pending are exactly that epoch's keys, each once."""
    counts = Counter(trained)
    twice = sorted(k for k, n in counts.items() if n > 1)
    assert not twice, f"trained twice: {twice[:5]}"
    assert all(k.epoch <= pool.epoch for k in counts), "a trained key the pool never handed out"
    for epoch in range(pool.epoch + 1):
        order = epoch_order(pool.num_prompts, pool.seed, epoch)
        keys = [PromptKey(epoch, int(i)) for i in (order if epoch < pool.epoch else order[:pool.cursor])]
        status = {k: pool.status(k) for k in keys}
        lost = [k for k in keys if status[k] == COMPLETED and k not in counts]
        assert not lost, f"lost (completed, never trained): {lost[:5]}"
        pending = [k for k in keys if status[k] != COMPLETED and k in counts]
        assert not pending, f"trained but still pending: {pending[0]} ({status[pending[0]]})"
        if epoch < pool.epoch and all(s == COMPLETED for s in status.values()):
            assert Counter(k for k in trained if k.epoch == epoch) == Counter(keys)


class RandomDriver:
    def __init__(self, scheduler: Scheduler, seed: int, max_tokens: int, engine_fail_rate: float = 0.0,
                 prompt_effect: dict | None = None) -> None:
        self.sched = scheduler
        self.rng = random.Random(seed)
        self.max_tokens = max_tokens
        self.fail_rate = engine_fail_rate
        self.prompt_effect = prompt_effect if prompt_effect is not None else {}
        self.now = 0.0
        self.queue: list = []  # (time, seq, event)
        self.seq = 0
        self.running: dict[str, tuple[float, int, int]] = {}  # rid -> (start, length, resumed)
        self.round_ends: list[EndRound] = []
        self.micro_batches: list[TrainMicroBatch] = []
        self.opt_steps: list[StepOptimizer] = []
        self.launches: list[LaunchRequest] = []
        self.aborts_sent: set[str] = set()
        self.aborted_answers: set[str] = set()
        """Requests whose answer was RequestAborted."""
        self.rewarded: set[str] = set()
        """Requests whose RewardScored the scheduler has handled."""

    def _push(self, at: float, event) -> None:
        heapq.heappush(self.queue, (at, self.seq, event))
        self.seq += 1

    def _length(self, cmd: LaunchRequest) -> int:
        mu = self.prompt_effect.setdefault(cmd.prompt.index, self.rng.gauss(4.0, 1.2))
        return max(1, min(self.max_tokens, int(math.exp(mu + self.rng.gauss(0, 0.4)))))

    def execute(self, commands) -> None:
        for cmd in commands:
            if isinstance(cmd, LaunchRequest):
                self.launches.append(cmd)
                assert cmd.request_id not in self.running
                resumed = sum(s.num_tokens for s in cmd.resume)
                total = self._length(cmd)
                new = max(1, min(cmd.max_new_tokens, total - resumed)) if total > resumed else 1
                reason = "length" if new >= cmd.max_new_tokens else "stop"
                self.running[cmd.request_id] = (self.now, new, resumed)
                if self.rng.random() < self.fail_rate:  # engine drops it half-way
                    self._push(self.now + new / 2, RequestAborted(cmd.request_id, new // 2))
                else:
                    self._push(self.now + new, RequestFinished(cmd.request_id, new, reason))
            elif isinstance(cmd, AbortRequest):
                assert cmd.request_id not in self.aborts_sent, "aborted twice"
                self.aborts_sent.add(cmd.request_id)
                start, new, _ = self.running[cmd.request_id]
                delay = self.rng.random() * 5
                at = self.now + delay
                if at < start + new:  # the abort lands before it finishes
                    self._push(at, RequestAborted(cmd.request_id, int(at - start)))
            elif isinstance(cmd, ScoreSample):
                reward = float(self.rng.random() < 0.5)
                self._push(self.now + self.rng.random() * 3, RewardScored(cmd.sample.request_id, reward))
            elif isinstance(cmd, TrainMicroBatch):
                self.micro_batches.append(cmd)
            elif isinstance(cmd, StepOptimizer):
                self.opt_steps.append(cmd)
            elif isinstance(cmd, EndRound):
                self.round_ends.append(cmd)

    def run_step(self, stop_after_events: int | None = None) -> bool:
        """Play one step to its optimizer step; False if stopped early after that many events."""
        self.execute(self.sched.begin_round())
        handled = 0
        while not self.sched.step_done:
            if stop_after_events is not None and handled >= stop_after_events:
                return False
            assert self.queue, "deadlock: the step is not done and nothing is pending"
            at, _, event = heapq.heappop(self.queue)
            self.now = max(self.now, at)
            rid = getattr(event, "request_id", None)
            if isinstance(event, (RequestFinished, RequestAborted)):
                if rid not in self.running:
                    continue  # its other answer (finish vs abort) already arrived
                del self.running[rid]
                if isinstance(event, RequestAborted):
                    self.aborted_answers.add(rid)
            elif isinstance(event, RewardScored):
                self.rewarded.add(rid)
            self.execute(self.sched.handle(event))
            handled += 1
        return True
