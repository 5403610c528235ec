"""Simulated rollout instances: continuous batching over a decode cost model, with a KV pool,
prefill, and preemption (recompute) when the pool runs out.

Theory of operation
-------------------
An instance advances in *segments*: between two changes (admission, finish, abort, preemption) its
running set is fixed, so every running request gains one token per decode step and the step time
is linear in the step index (context grows by b tokens a step):

    step(s) = t0 + t1 * b + t2 * C(s),   C(s) = A + b * s

with s the instance's step counter (a float: a change may land inside a step, and the partial step
counts) and A = sum over running requests of (context at admission - step at admission).  Time to
go from s0 to s0 + k is k * step(s0) + t2 * b * k^2 / 2 (the fluid limit of the sum), inverted in
closed form, so a segment costs O(log n), not one Python iteration per token.  The next event of an
instance is the earliest of: a request reaching its length, the KV pool filling up.  When the pool is
full the newest running request is preempted (vLLM's recompute policy): it goes back to the head of
the queue with its tokens and is prefilled again (prompt + generated) when room frees up.

Admission (vLLM-like): waiting requests are admitted in order while the pool keeps `watermark` of
its capacity free and fewer than `max_running` run.  Their prefill pauses the instance's decoding.
"""

from __future__ import annotations

import heapq
import math

from collections.abc import Sequence

from attrs import define, field

from rollpacker.core.cost_model import CostModel

from .speculation import SpecConstants


@define(eq=False)
class SimRequest:
    rid: str
    prompt_tokens: int
    """Prompt plus resumed prefix: the context to prefill."""
    target: int
    """New tokens this request generates before it ends on its own."""
    reason: str
    generated: int = 0
    """Tokens generated up to the last preemption (or 0)."""
    start: float = 0.0
    """Instance step at (re)admission."""
    running: bool = False
    order: int = 0
    """Admission order, to preempt the newest first."""
    base_term: float = 0.0
    """Its share of the instance's A while running."""
    group: object = None
    """Its prompt, for an engine that prefills a prompt once for the requests of one admission
    (`cost.shared_prefill`); None: a prefill of its own (a resumed prefix, a preempted request)."""

    def context(self, step: float) -> float:
        return self.prompt_tokens + self.generated + (step - self.start if self.running else 0.0)

    def tokens(self, step: float) -> int:
        return min(self.target, int(self.generated + (step - self.start if self.running else 0.0) + 1e-9))


@define(eq=False)
class Interval:
    start: float
    end: float
    running: int
    kind: str
    """"decode", "prefill" or "event" (the driver handling requests that ended: `Instance.stall`)."""


@define(eq=False)
class Instance:
    index: int
    cost: CostModel
    max_running: int
    watermark: float
    capacity: int = field(init=False)
    time: float = 0.0
    """Time at which `step` holds (the segment start)."""
    step: float = 0.0
    running: dict = field(factory=dict)
    waiting: list = field(factory=list)
    arriving: list = field(factory=list)
    """(arrival time, request) of requests launched here that have not reached the engine yet (`cost.launch_s`)."""
    finish_heap: list = field(factory=list)
    base: float = 0.0
    """A: sum over running of (context at admission - start step)."""
    version: int = 0
    orders: int = 0
    preemptions: int = 0
    busy_s: float = 0.0
    peak_running: int = 0
    peak_kv: float = 0.0
    intervals: list | None = None
    spec: SpecConstants = field(factory=SpecConstants)
    """Speculative decoding in the tail: scales the time per token when the batch is small."""
    spec_share: float = 0.0
    """Mean share of the running requests' siblings that have finished (what the drafter copies from);
    the simulation sets it between segments."""

    def __attrs_post_init__(self) -> None:
        self.capacity = self.cost.kv_capacity

    # -- the segment arithmetic -------------------------------------------------------------------

    @property
    def batch(self) -> int:
        return len(self.running)

    def kv_at(self, step: float) -> float:
        return self.base + self.batch * step

    def attended_at(self, step: float) -> float:
        """The context a decode step's t2 term counts: the KV held (`kv_at`), or, where the engine's decode
        attends every row over the longest row's columns (`cost.attention_columns` m > 0), rows x that longest
        context, plus (m - 1) / 2 for its rounding up to a multiple of m (on average over the steps)."""
        m = self.cost.attention_columns
        if not m or not self.running:
            return self.kv_at(step)
        return self.batch * (max(r.base_term for r in self.running.values()) + step + (m - 1) / 2)

    def _elapsed(self, k: float) -> float:
        c = self.cost
        b = self.batch
        return (k * c.step_time(b, self.attended_at(self.step)) + c.t2 * b * k * k / 2) * self.slowdown()

    def slowdown(self) -> float:
        return self.spec.slowdown(self.cost, self.batch, self.spec_share)

    def _steps_in(self, dt: float) -> float:
        if dt <= 0 or not self.running:
            return 0.0
        c = self.cost
        b = self.batch
        dt = dt / self.slowdown()
        lin = c.step_time(b, self.attended_at(self.step))
        a = c.t2 * b / 2
        if a <= 0:
            return dt / lin
        return (-lin + math.sqrt(lin * lin + 4 * a * dt)) / (2 * a)

    def advance_to(self, now: float) -> None:
        """Move the segment start to `now` (decoding with the current running set)."""
        if now <= self.time:
            return
        if self.running:
            self.step += self._steps_in(now - self.time)
            self._log(self.time, now, "decode")
            self.busy_s += now - self.time
        self.time = now

    def _log(self, start: float, end: float, kind: str) -> None:
        if self.intervals is not None and end > start:
            self.intervals.append(Interval(start, end, self.batch, kind))

    def next_event_time(self) -> float | None:
        if not self.running:
            return None
        k = math.inf
        while self.finish_heap:
            at, rid = self.finish_heap[0]
            req = self.running.get(rid)
            if req is None or abs(req.start + req.target - req.generated - at) > 1e-9:
                heapq.heappop(self.finish_heap)  # stale (aborted, preempted or re-admitted)
                continue
            k = max(0.0, at - self.step)
            break
        b = self.batch
        if b > 1:
            k = min(k, max(0.0, (self.capacity - self.kv_at(self.step)) / b))
        return self.time + self._elapsed(k)

    # -- changes ----------------------------------------------------------------------------------

    def submit(self, req: SimRequest, now: float, arrives: float | None = None) -> None:
        """Queue `req`; a launch (`arrives` given: not a move between instances) costs the engine `cost.submit_s`
        once it reaches it, and with `arrives` later than now it waits in `arriving` until `arrive` at that time."""
        self.advance_to(now)
        if arrives is not None and arrives > now:
            self.arriving.append((arrives, req))
        else:
            self.waiting.append(req)
            self.stall(int(arrives is not None), "submit", self.cost.submit_s)

    def arrive(self, now: float) -> None:
        """The requests whose submission reached the engine by `now` join the queue."""
        self.advance_to(now)
        came = [req for at, req in self.arriving if at <= now]
        self.waiting.extend(came)
        self.arriving = [(at, req) for at, req in self.arriving if at > now]
        self.stall(len(came), "submit", self.cost.submit_s)

    def _start(self, req: SimRequest) -> None:
        req.running, req.start = True, self.step
        self.orders += 1
        req.order = self.orders
        self.running[req.rid] = req
        req.base_term = req.prompt_tokens + req.generated - self.step
        self.base += req.base_term
        heapq.heappush(self.finish_heap, (req.start + req.target - req.generated, req.rid))

    def _stop(self, req: SimRequest) -> None:
        req.generated = req.tokens(self.step)
        self.base -= req.base_term
        del self.running[req.rid]
        req.running = False
        if not self.running:
            self.base = 0.0  # no drift survives an empty batch

    def _worth_a_prefill(self) -> bool:
        """With requests running, waiting ones start only once `cost.admit_fraction` of the running count
        can start together, or all of them (the embedded engine's rule: one batched prefill)."""
        if not self.running:
            return True
        can = min(self.max_running - len(self.running), len(self.waiting))
        return can >= max(1, int(self.cost.admit_fraction * len(self.running))) or can == len(self.waiting)

    def admit(self) -> None:
        """Admit waiting requests (prefill pauses decoding)."""
        if not self._worth_a_prefill():
            return
        limit = self.capacity * (1.0 - self.watermark)
        prefill = 0.0
        prefilled: set = set()
        kv = self.kv_at(self.step) if self.running else 0.0
        while self.waiting and len(self.running) < self.max_running:
            req = self.waiting[0]
            need = req.prompt_tokens + req.generated
            if self.running and kv + need > limit:
                break
            self.waiting.pop(0)
            prefill += self._prefill_time(req, prefilled)
            self._start(req)
            kv += need
        self.peak_running = max(self.peak_running, len(self.running))
        if prefill > 0:
            prefill += self.cost.prefill_batch_s
            self._log(self.time, self.time + prefill, "prefill")
            self.busy_s += prefill
            self.time += prefill
        self.peak_kv = max(self.peak_kv, self.kv_at(self.step) if self.running else 0.0)

    def _prefill_time(self, req: SimRequest, prefilled: set) -> float:
        """What `req` adds to an admission's prefill: its prompt (and generated tokens), or nothing when
        the engine shares a prompt's prefill and a sibling of this admission already computed it (its KV
        cache copied: the embedded engine's `Runner.prefill`)."""
        if self.cost.shared_prefill and req.group is not None and req.generated == 0:
            if req.group in prefilled:
                return 0.0
            prefilled.add(req.group)
        return self.cost.prefill_time(req.prompt_tokens + req.generated)

    def stall(self, count: int, kind: str = "event", each: float | None = None) -> None:
        """`count` requests finished: the engine loses `cost.event_s` each (the driver's handling of a
        finished request, its reward job included; an abort is one call for many and scores nothing); or
        `count` of another `kind`, `each` seconds each."""
        seconds = count * (self.cost.event_s if each is None else each)
        if seconds > 0:
            self._log(self.time, self.time + seconds, kind)
            self.busy_s += seconds
            self.time += seconds

    def remove(self, rid: str, now: float) -> SimRequest | None:
        """Take a request off the instance (abort); returns it with `generated` up to date."""
        self.advance_to(now)
        req = self.running.get(rid)
        if req is not None:
            self._stop(req)
            return req
        for i, w in enumerate(self.waiting):
            if w.rid == rid:
                return self.waiting.pop(i)
        for i, (_, w) in enumerate(self.arriving):
            if w.rid == rid:
                return self.arriving.pop(i)[1]
        return None

    def wake(self, now: float) -> list[SimRequest]:
        """Handle what is due at `now`: finished requests (returned), and preemptions."""
        self.advance_to(now)
        done = []
        for req in list(self.running.values()):
            if req.generated + (self.step - req.start) >= req.target - 1e-6:
                self._stop(req)
                req.generated = req.target
                done.append(req)
        self.stall(len(done))
        # Invariant: one request alone always fits (checked when the instance is built), so the
        # pool can be relieved by preempting all but one.
        while len(self.running) > 1 and self.kv_at(self.step) >= self.capacity * (1 - 1e-9):
            newest = max(self.running.values(), key=lambda r: r.order)
            self._stop(newest)
            self.waiting.insert(0, newest)
            self.preemptions += 1
        return done

    def kv_used(self) -> float:
        return self.kv_at(self.step) if self.running else 0.0


def redispatch(instances: Sequence[Instance]) -> tuple[str, Instance, Instance] | None:
    """`engine.redispatch`'s next move, or None: when the busiest instance holds 2 or more requests more
    than the idlest, (its newest request, a waiting one first; the busiest; the idlest).  Each move lowers
    the sum of squared loads, so moving until None ends."""
    load = lambda i: len(i.running) + len(i.waiting)  # noqa: E731
    busiest = max(instances, key=lambda i: (load(i), -i.index))
    idlest = min(instances, key=lambda i: (load(i), i.index))
    if load(busiest) - load(idlest) < 2:
        return None
    pick = busiest.waiting[-1] if busiest.waiting else max(busiest.running.values(), key=lambda r: r.order)
    return pick.rid, busiest, idlest
