"""TP planner: the tensor-parallel size (and so the number of rollout instances) for a round.

Two rules, both pure:

A TP size is valid for a model only when it divides both its attention heads and its KV heads
(each GPU holds whole heads: Qwen2.5-7B's 28 heads / 4 KV heads allow TP 1, 2, 4, not 8), fits in a
node and divides the GPU count (`valid_tps`); no rule below ever names another size.

`plan_tp` (model-based).  For each valid TP in `candidates` that leaves a KV pool that holds one
full request, predict the round's makespan with the cost model
(cost_model.py), add the switch's seconds to every TP but the running one, and pick the smallest
(greedy per round: a switch is charged to the round that makes it, not spread over the rounds that
might keep it).  The prediction balances the round's requests over the
instances (longest first, round robin), then integrates the decode step time of the busiest
instance over its steps k = 0..max length:

    b(k) = requests longer than k,  C(k) = sum over them of (prompt + k)
    time = sum_k step(b(k), C(k)) * max(1, C(k) / KV capacity)

The last factor is the KV-bound regime: when the contexts exceed the pool only capacity / C of the
work can run at once (preemption and recompute are charged no further).  Larger TP cuts t0/t1/t2 per
instance but leaves fewer instances, so it wins when the KV pool is the bottleneck (long contexts,
big models) and loses when instances are the bottleneck (many short requests).

`OnlineTP` (RollPacker, arXiv 2509.21009 section 4.2): observe preemptions per step; double TP when
they grow by more than `jump` (1.05x) over the previous step; halve it after `quiet_steps` (4)
steps without any.

`TpRule` is what the `Scheduler` holds to choose each round's TP by one of them ("plan" or "online";
"fixed" keeps the starting TP): it emits `SetTensorParallel` before a round whose TP differs from
the last one, and is told each step's preemptions.
"""

from __future__ import annotations

import attrs
import numpy as np
from attrs import field, frozen
from attrs.validators import in_

from .cost_model import CostModel, Hardware, ModelShape
from .errors import ConfigError
from .prompt_pool import PromptPool
from .validators import non_negative_number

CANDIDATES = (1, 2, 4, 8)


@frozen
class TpChoice:
    tp: int
    instances: int
    makespan_s: float
    """Predicted makespan of the round at this TP, its switch included."""
    options: tuple[tuple[int, float], ...]
    """(tp, predicted makespan with its switch) of every feasible candidate."""


def predict_makespan(cost: CostModel, lengths: np.ndarray, prompt_tokens: float, instances: int,
                     grid: int = 512) -> float:
    """Predicted rollout makespan of `lengths` (decode tokens per request) on `instances` instances."""
    lengths = np.sort(np.asarray(lengths, dtype=float))[::-1]
    if lengths.size == 0:
        return 0.0
    mine = lengths[::instances]  # the busiest instance: it gets the longest request
    top = float(mine[0])
    ks = np.linspace(0.0, top, grid + 1)
    mids = (ks[1:] + ks[:-1]) / 2
    asc = mine[::-1]
    batch = asc.size - np.searchsorted(asc, mids, side="right")
    context = batch * (prompt_tokens + mids)
    step = cost.t0 + cost.t1 * batch + cost.t2 * context
    slow = np.maximum(1.0, context / max(cost.kv_capacity, 1))
    prefill = cost.prefill_time(prompt_tokens) * asc.size
    return float(np.sum(step * slow) * (top / grid) + prefill)


def divides_heads(model: ModelShape, tp: int) -> bool:
    """Whether `tp` GPUs can split `model`'s attention: whole query heads and whole KV heads each."""
    return model.heads % tp == 0 and model.kv_heads % tp == 0


def valid_tps(model: ModelShape, hardware: Hardware, gpus: int,
              candidates: tuple[int, ...] = CANDIDATES) -> list[int]:
    """The candidates that divide the heads and KV heads and the GPU count, within one node."""
    return [tp for tp in candidates if tp <= hardware.gpus_per_node and gpus % tp == 0 and divides_heads(model, tp)]


def check_tp(model: ModelShape, hardware: Hardware, gpus: int, tp: int, name: str = "tp") -> None:
    """One clear error if `tp` is not a valid TP size for `model` on `gpus` GPUs (`name`: the field or flag)."""
    valid = valid_tps(model, hardware, gpus, tuple(range(1, hardware.gpus_per_node + 1)))
    if tp not in valid:
        raise ConfigError(
            f"{name} {tp} is not a valid tensor-parallel size for {model.name} ({model.heads} attention heads, "
            f"{model.kv_heads} KV heads) on {gpus} GPUs ({hardware.gpus_per_node} a node): it must divide the heads, "
            f"the KV heads and the GPU count; valid: {', '.join(map(str, valid)) or 'none'}")


def feasible_tps(model: ModelShape, hardware: Hardware, gpus: int, mem_fraction: float,
                 max_context: int, candidates: tuple[int, ...] = CANDIDATES) -> list[int]:
    """The valid TPs (`valid_tps`) whose KV pool holds one request of `max_context` tokens."""
    out = []
    for tp in valid_tps(model, hardware, gpus, candidates):
        if CostModel(model=model, hardware=hardware, tp=tp, mem_fraction=mem_fraction).kv_capacity > max_context:
            out.append(tp)
    return out


def plan_tp(model: ModelShape, hardware: Hardware, gpus: int, mem_fraction: float, lengths,
            prompt_tokens: float, max_context: int, candidates: tuple[int, ...] = CANDIDATES,
            current: int | None = None, switch_s: float = 0.0) -> TpChoice:
    """The TP (and instance count gpus / TP) with the smallest predicted makespan, `switch_s` added to
    every TP but the `current` one (None: no rollout yet, every TP pays it)."""
    if not 0 <= switch_s < float("inf"):
        raise ConfigError(f"switch_s must be a finite number >= 0, got {switch_s!r}")
    tps = feasible_tps(model, hardware, gpus, mem_fraction, max_context, candidates)
    if not tps:
        raise ConfigError(
            f"{model.name} does not fit on {gpus} GPUs at any valid TP in {candidates} (dividing its "
            f"{model.heads} heads and {model.kv_heads} KV heads) with mem_fraction "
            f"{mem_fraction} and {max_context} tokens of context per request"
        )
    options = []
    for tp in tps:
        cost = CostModel(model=model, hardware=hardware, tp=tp, mem_fraction=mem_fraction)
        switch = 0.0 if tp == current else switch_s
        options.append((tp, switch + predict_makespan(cost, lengths, prompt_tokens, gpus // tp)))
    tp, makespan = min(options, key=lambda o: (o[1], o[0]))
    return TpChoice(tp, gpus // tp, makespan, tuple(options))


def _tp_value(instance, attribute, value) -> None:
    if not isinstance(value, int) or value < 1 or value & (value - 1):
        raise ConfigError(f"{attribute.name} must be a power of two >= 1, got {value!r}")


@frozen(kw_only=True)
class OnlineTP:
    """RollPacker's online rule, as immutable state: `observe(preemptions)` returns the next state."""

    tp: int = field(validator=_tp_value)
    min_tp: int = field(default=1, validator=_tp_value)
    max_tp: int = field(default=8, validator=_tp_value)
    jump: float = 1.05
    quiet_steps: int = 4
    last: int | None = None
    """Preemptions of the previous step."""
    quiet: int = 0
    """Steps in a row without preemptions."""

    def observe(self, preemptions: int) -> OnlineTP:
        if preemptions < 0:
            raise ConfigError(f"preemptions must be >= 0, got {preemptions}")
        tp, quiet = self.tp, self.quiet
        if preemptions == 0:
            quiet += 1
            if quiet >= self.quiet_steps and tp > self.min_tp:
                tp, quiet = tp // 2, 0
        else:
            quiet = 0
            if self.last is not None and preemptions > self.jump * self.last and tp < self.max_tp:
                tp *= 2
        return attrs.evolve(self, tp=tp, quiet=quiet, last=preemptions)


TP_MODES = ("fixed", "plan", "online")


@frozen(kw_only=True)
class TpRule:
    """How a Scheduler picks the rollout TP of each round, and the fleet it picks it for."""

    mode: str = field(validator=in_(TP_MODES))
    """"fixed" (the starting TP), "plan" (`plan_tp` on the round's predicted lengths), "online" (`OnlineTP`)."""
    tp: int = field(validator=_tp_value)
    """The TP the rollout starts at."""
    model: ModelShape
    hardware: Hardware
    gpus: int
    mem_fraction: float
    max_context: int
    """Prompt plus response tokens of the longest request."""
    prompt_tokens: tuple[int, ...]
    """Prompt length of every dataset prompt, by index."""
    unseen_length: float
    """Predicted response length of a prompt with no history yet."""
    switch_s: float = field(default=0.0, validator=non_negative_number)
    """Seconds a change of TP costs the step (stopping and restarting the engines): "plan" counts it
    against every TP but the one running, all of it against the one round's predicted gain.  That is
    greedy: a TP chosen then usually holds for many rounds, so a cost near a round's gain keeps the
    starting TP for good (the simulator leaves it 0 for that reason: see `engine.tp_switch_s`)."""

    def __attrs_post_init__(self) -> None:
        check_tp(self.model, self.hardware, self.gpus, self.tp)

    def feasible(self) -> list[int]:
        return feasible_tps(self.model, self.hardware, self.gpus, self.mem_fraction, self.max_context)

    def initial(self) -> OnlineTP:
        tps = self.feasible() or [self.tp]
        return OnlineTP(tp=self.tp, max_tp=max(tps), min_tp=min(tps))

    def choose(self, online: OnlineTP, pool: PromptPool, launches, current: int | None = None) -> int:
        """The TP for a round that launches `launches` (LaunchRequests), the rollout now at `current`."""
        if self.mode == "online":
            return online.tp
        if self.mode == "fixed":
            return self.tp
        lengths = []
        for cmd in launches:
            pred = pool.predict(cmd.prompt.index)
            lengths.append(min(float(pred.median if pred.count else self.unseen_length), cmd.max_new_tokens))
        prompt = sum(self.prompt_tokens[c.prompt.index] for c in launches) / max(len(launches), 1)
        return plan_tp(self.model, self.hardware, self.gpus, self.mem_fraction, lengths, prompt, self.max_context,
                       candidates=tuple(self.feasible()), current=current, switch_s=self.switch_s).tp
