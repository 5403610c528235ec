"""The test harness: a random-order engine, scorer and trainer as one fake backend of the real
`driver.Driver`, on a `VirtualClock`, so the property suites run the driver and the core's reward
scheduler exactly as live runs and the simulator do.

Each launched request gets a length drawn from its prompt's length (per-prompt effect plus noise)
and finishes at launch time + length / speed; an abort lands after a random delay (so a request may
finish before its abort arrives, as with a real engine).  Each scorer answers after a random delay,
reward 0 or 1; one slower than the core's adaptive deadline is timed out by the core (the clock
passes the deadline first), then hangs or answers late (the core ignores that answer).  It checks
the Protocol obligations (one answer per request) as it goes.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter

from rollpacker.core import (
    EndRound,
    LaunchRequest,
    RequestAborted,
    RequestFinished,
    RewardScored,
    Scheduler,
    StartScoring,
    StepOptimizer,
    TrainMicroBatch,
)
from rollpacker.core.prompt_pool import COMPLETED, PromptPool, epoch_order
from rollpacker.core.records import PromptKey
from rollpacker.driver import DeadlinePassed, Driver, ScorerAnswered, VirtualClock


class Crashed(Exception):
    """The harness stopped a step after the number of events it was given (a crash mid-step)."""


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


class RandomBackend:
    """Engine, scorer and trainer of `driver.Driver`, and its observer; `run_step()` plays one step."""

    SCORER_S = 3.0
    """Scorers answer after up to this many seconds (past the core's 2 s floor: some time out)."""

    def __init__(self, scheduler: Scheduler, seed: int, max_tokens: int, engine_fail_rate: float = 0.0,
                 prompt_effect: dict | None = None) -> None:
        self.sched = scheduler
        self.clock = VirtualClock()
        self.driver = Driver(scheduler, self, self.clock)
        self.rng = random.Random(seed)
        self.max_tokens = max_tokens
        self.fail_rate = engine_fail_rate
        self.prompt_effect = prompt_effect if prompt_effect is not None else {}
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
        """Requests whose RewardScored the scheduler has handled (answered or timed out)."""
        self.events = 0
        self.stop_after: int | None = None

    @property
    def now(self) -> float:
        return self.clock.now()

    def _push(self, at: float, event) -> None:
        heapq.heappush(self.queue, (at, self.seq, event))
        self.seq += 1

    def _length(self, cmd: LaunchRequest) -> int:
        mu = self.prompt_effect.setdefault(cmd.prompt.index, self.rng.gauss(4.0, 1.2))
        return max(1, min(self.max_tokens, int(math.exp(mu + self.rng.gauss(0, 0.4)))))

    # -- the Backend's commands ------------------------------------------------------------------

    def launch(self, commands) -> None:
        for cmd in commands:
            self.launches.append(cmd)
            assert cmd.request_id not in self.running
            resumed = sum(s.num_tokens for s in cmd.resume)
            total = self._length(cmd)
            new = max(1, min(cmd.max_new_tokens, total - resumed)) if total > resumed else 1
            reason = "length" if new >= cmd.max_new_tokens else "stop"
            self.running[cmd.request_id] = (self.now, new, resumed)
            if self.rng.random() < self.fail_rate:  # engine drops it half-way
                self._push(self.now + new / 2, RequestAborted(cmd.request_id, new // 2, self.now + new / 2))
            else:
                self._push(self.now + new, RequestFinished(cmd.request_id, new, reason, self.now + new))

    def abort(self, request_ids) -> None:
        for rid in request_ids:
            assert rid not in self.aborts_sent, "aborted twice"
            self.aborts_sent.add(rid)
            start, new, _ = self.running[rid]
            at = self.now + self.rng.random() * 5
            if at < start + new:  # the abort lands before it finishes
                self._push(at, RequestAborted(rid, int(at - start), at))

    def set_tensor_parallel(self, command) -> None:
        raise AssertionError("the harness's schedulers have no TpRule")

    def start_scoring(self, command: StartScoring) -> None:
        reward = float(self.rng.random() < 0.5)
        seconds = self.rng.random() * self.SCORER_S
        late = seconds > command.time_limit
        if late:  # the core times it out at its deadline
            self._push(command.deadline, DeadlinePassed())
        if not late or self.rng.random() < 0.5:  # a late scorer hangs, or answers after its deadline
            self._push(self.now + seconds, ScorerAnswered(command.request_id, reward))

    def train(self, command: TrainMicroBatch) -> None:
        self.micro_batches.append(command)

    def step_optimizer(self, command: StepOptimizer) -> None:
        self.opt_steps.append(command)

    def wait(self) -> list:
        """The next event in time order (a request's second answer, finish vs abort, is dropped)."""
        if self.stop_after is not None and self.events >= self.stop_after:
            raise Crashed
        while True:
            assert self.queue, "deadlock: the step is not done and nothing is pending"
            at, _, event = heapq.heappop(self.queue)
            self.clock.advance_to(at)
            if isinstance(event, (RequestFinished, RequestAborted)):
                if event.request_id not in self.running:
                    continue  # its other answer (finish vs abort) already arrived
                del self.running[event.request_id]
                if isinstance(event, RequestAborted):
                    self.aborted_answers.add(event.request_id)
            self.events += 1
            return [event]

    # -- the Observer ----------------------------------------------------------------------------

    def observe(self, notice) -> None:
        if isinstance(notice, RewardScored):
            self.rewarded.add(notice.request_id)
        elif isinstance(notice, EndRound):
            self.round_ends.append(notice)

    def finish_step(self, ledger, pending) -> dict:
        return {"step": self.opt_steps[-1].step, "trained": len(ledger.trained), "pending": len(pending)}

    # -- playing ---------------------------------------------------------------------------------

    def run_step(self, stop_after_events: int | None = None) -> bool:
        """Play one step to its optimizer step through the driver; False if stopped (a crash) after
        that many more events."""
        self.stop_after = None if stop_after_events is None else self.events + stop_after_events
        try:
            self.driver.run_step()
        except Crashed:
            return False
        finally:
            self.stop_after = None
        return True
