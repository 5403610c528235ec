"""Stream batcher: rewarded samples in, training micro-batches and one optimizer step out.

A group's advantages need all of its rewards, so a group is packed once it is complete
(CloseGroup from the planner) and every sample of it is scored (RewardScored).  Packed samples
go into micro-batches of at most `token_budget` response tokens (a longer sample goes alone), in
the order groups became ready (completion order).  When the round has ended and every trained group
is packed, the last micro-batch and the `StepOptimizer` are emitted.

Loss aggregation (the normalisation that makes streamed micro-batches sum to the full batch):
- "token-mean" (default; DAPO's token-level loss): loss = sum_i sum_t l_it / sum_i |y_i|.
  Every sample's token_weight is 1; the step's loss_normalizer is the total response tokens.
- "seq-mean-token-mean" (original GRPO): loss = (1/N) sum_i (1/|y_i|) sum_t l_it.
  token_weight is 1/|y_i|; loss_normalizer is N, the number of trained samples.
Either way the trainer accumulates gradients of sum_i token_weight_i * sum_t l_it per micro-batch
and divides by loss_normalizer once, so the sum over micro-batches equals the full-batch gradient
exactly, whatever the split.

Advantages are computed per group (advantages.py: "grpo", "grpo-mean" or "rloo").  With
`dynamic_sampling` (DAPO), groups whose rewards all agree carry no signal and are dropped;
StepOptimizer lists them.
"""

from __future__ import annotations

from attrs import field, frozen
from attrs.validators import in_
from immutables import Map

from .advantages import ADVANTAGES, advantages
from .commands import (
    CloseGroup,
    Command,
    EndRound,
    ScoreSample,
    StepOptimizer,
    TrainMicroBatch,
    TrainSampleRef,
)
from .errors import SchedulerMisuse
from .events import Event, RewardScored
from .records import PromptKey, Sample, replace, request_id as request_id_of, request_number, state
from .states import RewardStatus, transition
from .validators import positive

LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean")
AWAITING, SCORED, DISCARDED, DROPPED = RewardStatus


@frozen(kw_only=True)
class BatcherConfig:
    token_budget: int = field(default=8192, validator=positive)
    """Most response tokens in one micro-batch."""
    advantage: str = field(default="grpo", validator=in_(ADVANTAGES))
    loss_aggregation: str = field(default="token-mean", validator=in_(LOSS_AGGREGATIONS))
    dynamic_sampling: bool = False
    """DAPO: drop groups whose rewards have zero variance."""
    eps: float = 1e-6


@state
class BatcherState:
    step: int = 0
    status: Map = field(factory=Map)
    """request number -> RewardStatus of every kept sample: AWAITING, SCORED, or DISCARDED (its
    group was not trained; its late reward is dropped)."""
    rewards: Map = field(factory=Map)
    """request number -> reward, for every SCORED sample."""
    waiting: Map = field(factory=Map)
    """request number -> a completed group still missing that reward: (prompt, samples, index of
    the first sample not yet checked)."""
    packed: tuple[TrainSampleRef, ...] = ()
    """Samples ready, not yet emitted (fewer than token_budget tokens)."""
    micro_batches: int = 0
    groups_ready: int = 0
    samples: int = 0
    tokens: int = 0
    normalizer: float = 0.0
    dropped: tuple[PromptKey, ...] = ()
    round_ended: EndRound | None = None


class StreamBatcher:
    def __init__(self, config: BatcherConfig | None = None) -> None:
        self.config = config or BatcherConfig()

    def initial(self, step: int = 0) -> BatcherState:
        return BatcherState(step=step)

    def handle(self, state: BatcherState, item: Event | Command) -> tuple[BatcherState, list[Command]]:
        """Feed planner commands (ScoreSample, CloseGroup, EndRound) and RewardScored events."""
        if isinstance(item, ScoreSample):
            number = item.sample.number
            if number in state.status:
                raise SchedulerMisuse(f"sample {item.sample.request_id} was kept twice")
            return replace(state, status=state.status.set(number, AWAITING)), []
        if isinstance(item, RewardScored):
            return self._reward(state, item)
        if isinstance(item, CloseGroup):
            return self._group(state, item.prompt, item.samples)
        if isinstance(item, EndRound):
            return self._maybe_finish(replace(state, round_ended=item), [])
        return state, []

    def _reward(self, state: BatcherState, event: RewardScored) -> tuple[BatcherState, list[Command]]:
        number = request_number(event.request_id)
        status = state.status.get(number)
        if status is None:
            raise SchedulerMisuse(f"can't handle RewardScored: request={event.request_id} was never kept for training")
        if transition(status, RewardScored, event.request_id) is DROPPED:
            return replace(state, status=state.status.delete(number)), []
        status_map, rewards = state.status.set(number, SCORED), state.rewards.set(number, float(event.reward))
        parked = state.waiting.get(number)
        if parked is None:
            return replace(state, status=status_map, rewards=rewards), []
        state = replace(state, status=status_map, rewards=rewards, waiting=state.waiting.delete(number))
        return self._group(state, *parked)

    def _group(self, state: BatcherState, prompt: PromptKey, samples: tuple[Sample, ...],
               checked: int = 0) -> tuple[BatcherState, list[Command]]:
        """Train the group if every reward is in; else park it under the first missing one.
        Rewards of samples[:checked] were in when it was parked (a reward never goes missing)."""
        for i in range(checked, len(samples)):
            number = samples[i].number
            if state.status[number] is AWAITING:  # re-checked from i + 1 when this one arrives
                return replace(state, waiting=state.waiting.set(number, (prompt, samples, i + 1))), []
        rewards = [state.rewards[s.number] for s in samples]
        # (their rewards stay in the map until the step ends: one sweep then, not a removal each)
        if self.config.dynamic_sampling and max(rewards) == min(rewards):
            state = replace(state, groups_ready=state.groups_ready + 1, dropped=state.dropped + (prompt,))
            return self._maybe_finish(state, [])
        adv = advantages(rewards, self.config.advantage, self.config.eps)
        refs = tuple(TrainSampleRef(s, a, self._weight(s)) for s, a in zip(samples, adv))
        commands: list[Command] = []
        packed, index = self._pack(state, refs, commands)
        state = replace(
            state,
            groups_ready=state.groups_ready + 1,
            samples=state.samples + len(refs),
            tokens=state.tokens + sum(s.num_tokens for s in samples),
            normalizer=state.normalizer + sum(self._norm(s) for s in samples),
            packed=packed,
            micro_batches=index,
        )
        return self._maybe_finish(state, commands)

    def _weight(self, sample: Sample) -> float:
        return 1.0 if self.config.loss_aggregation == "token-mean" else 1.0 / max(sample.num_tokens, 1)

    def _norm(self, sample: Sample) -> float:
        return float(sample.num_tokens) if self.config.loss_aggregation == "token-mean" else 1.0

    def _pack(self, state: BatcherState, refs: tuple[TrainSampleRef, ...],
              commands: list[Command]) -> tuple[tuple[TrainSampleRef, ...], int]:
        """Add refs to the open micro-batch, emitting each one that fills up; the new open batch and index."""
        packed, index = list(state.packed), state.micro_batches
        tokens = sum(r.sample.num_tokens for r in packed)
        budget = self.config.token_budget
        for ref in refs:
            if packed and tokens + ref.sample.num_tokens > budget:
                commands.append(TrainMicroBatch(state.step, index, tuple(packed)))
                packed, index, tokens = [], index + 1, 0
            packed.append(ref)
            tokens += ref.sample.num_tokens
        return tuple(packed), index

    def _maybe_finish(self, state: BatcherState, commands: list[Command]) -> tuple[BatcherState, list[Command]]:
        ended = state.round_ended
        if ended is None or state.groups_ready < len(ended.trained):
            return state, commands
        index = state.micro_batches
        if state.packed:
            commands.append(TrainMicroBatch(state.step, index, state.packed))
            index += 1
        commands.append(
            StepOptimizer(state.step, state.normalizer, state.samples, state.tokens, index, state.dropped)
        )
        carried = {request_number(r) for r in ended.carried_requests}
        status, rewards = Map(), Map()  # carried samples keep their reward; pending ones of dropped groups are moot
        for number, current in state.status.items():
            if number in carried:
                status = status.set(number, current)
                if current is SCORED:
                    rewards = rewards.set(number, state.rewards[number])
            elif current is AWAITING:
                status = status.set(number, transition(current, StepOptimizer, request_id_of(number)))
            elif current is DISCARDED:  # discarded in an earlier step, its reward still to come (a queued
                status = status.set(number, current)  # or long execution): dropped when it comes
        return BatcherState(step=ended.step + 1, status=status, rewards=rewards), commands
