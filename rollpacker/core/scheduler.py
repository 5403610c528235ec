"""Scheduler: the planner and the stream batcher wired together, behind one mutable handle.

The pure components take and return immutable state; a driver usually wants one object that it
feeds events and that hands back commands.  This is that object (as h11's Connection wraps its
state machine): it routes the planner's ScoreSample / CloseGroup / EndRound to the batcher,
RewardScored to the batcher, request events to the planner, and returns every command.

It chooses each round's rollout TP when given a `TpRule` (tp_planner.py): `SetTensorParallel`
comes before the launches of a round whose TP differs from the last, and `observe_preemptions`
feeds RollPacker's online rule.

It also holds the reward scheduler (reward_scheduler.py: worker budget and RollPacker's adaptive
timeout), so every driver gets each sample's scoring deadline from the core.  A driver that runs
scorers with deadlines calls `start_scoring` for each ScoreSample, runs a scorer for each
`StartScoring(request_id, deadline, at)` it gets back (for `time_limit` seconds), reports answers
with `scoring_finished` and calls `expire_rewards` when the clock passes `next_reward_expiry`; it
calls `hedge_rewards` when the clock passes a StartScoring's `hedge_at`.  A driver whose reward
executor may start a job late and times it out from that start tells the core how late
(`set_reward_grace`): the core then cuts a scoring only that long past its deadline.  A driver that
scores on its own answers ScoreSample with `handle(RewardScored(...))` instead.

    sched = Scheduler(make_policy("tail", prompts=P, samples=R, max_tokens=L), num_prompts=N)
    commands = sched.begin_round()
    while not sched.step_done:
        commands = sched.handle(next_event())    # execute LaunchRequest/AbortRequest/ScoreSample/
                                                 # TrainMicroBatch/StepOptimizer as they come
"""

from __future__ import annotations

import attrs

from .commands import CloseGroup, Command, EndRound, LaunchRequest, ScoreSample, SetTensorParallel, StepOptimizer
from .events import Event, RewardScored
from .planner import Policy, RoundPlanner
from .reward_scheduler import RewardConfig, RewardScheduler, RewardState
from .round_state import PlannerState
from .stream_batcher import BatcherConfig, BatcherState, StreamBatcher
from .tp_planner import OnlineTP, TpRule

_FOR_BATCHER = (ScoreSample, CloseGroup, EndRound)


class Scheduler:
    def __init__(self, policy: Policy, num_prompts: int, seed: int = 0, batcher: BatcherConfig | None = None,
                 checkpoint: dict | None = None, rewards: RewardConfig | None = None,
                 tp: TpRule | None = None, epochs: int | None = None) -> None:
        self.planner = RoundPlanner(policy)
        self.batcher = StreamBatcher(batcher)
        self.rewards = RewardScheduler(rewards)
        self.reward_state: RewardState = self.rewards.initial()
        """Scoring in flight and T_anchor; a checkpoint keeps T_anchor (a restored step scores its samples again)."""
        if checkpoint is None:
            self.state: PlannerState = self.planner.initial(num_prompts, seed, epochs)
        else:
            self.state = self.planner.from_dict(checkpoint)
            self.reward_state = attrs.evolve(self.reward_state, anchor=checkpoint.get("reward_anchor"))
        self.batch_state: BatcherState = self.batcher.initial(self.state.step)
        self._committed: PlannerState = self.state
        """Planner state as of the last optimizer step: what a checkpoint saves."""
        self.step_done = True
        """True between a StepOptimizer and the next begin_round."""
        self._complete: set[str] = set()
        """Samples of this round's complete groups (CloseGroup), for `start_scoring`'s priority."""
        self.tp_rule = tp
        self.tp_state: OnlineTP | None = tp.initial() if tp is not None else None
        """The online rule's state (its preemption history); None without a TpRule."""
        self.tp: int | None = tp.tp if tp is not None else None
        """The rollout TP in use (None: not the core's choice)."""

    @property
    def policy(self) -> Policy:
        return self.planner.policy

    def begin_round(self) -> list[Command]:
        self.step_done = False
        self._complete.clear()
        self.state, commands = self.planner.begin_round(self.state)
        return self._route(self._with_tp(commands))

    def _with_tp(self, commands: list[Command]) -> list[Command]:
        if self.tp_rule is None:
            return commands
        tp = self.tp_rule.choose(self.tp_state, self.state.pool, [c for c in commands if isinstance(c, LaunchRequest)],
                                 current=self.tp)
        if tp == self.tp:
            return commands
        self.tp = tp
        return [SetTensorParallel(tp), *commands]

    def observe_preemptions(self, preemptions: int) -> None:
        """The rollout's preemptions in the step just trained (RollPacker's online TP rule)."""
        if self.tp_state is not None:
            self.tp_state = self.tp_state.observe(preemptions)

    def handle(self, event: Event) -> list[Command]:
        if isinstance(event, RewardScored):
            self.batch_state, commands = self.batcher.handle(self.batch_state, event)
            return self._note(commands)
        self.state, commands = self.planner.handle(self.state, event)
        return self._route(commands)

    # -- scoring with the core's deadlines --------------------------------------------------------

    @property
    def next_reward_expiry(self) -> float | None:
        """When the core next cuts a scoring (its deadline plus the executor's start grace)."""
        return self.reward_state.next_expiry

    def set_reward_grace(self, seconds: float) -> None:
        """The reward executor may start a job `seconds` late and times it out from that start: the
        core cuts a scoring only `seconds` past its deadline."""
        self.reward_state = self.rewards.set_grace(self.reward_state, seconds)

    @property
    def reward_timeout(self) -> float:
        """The adaptive timeout a sample starting scoring now gets (its deadline is this past its start)."""
        return self.rewards.config.timeout(self.reward_state.anchor)

    def start_scoring(self, request_id: str, at: float) -> list:
        """Queue a kept sample (from ScoreSample) for scoring: `StartScoring` for each sample that
        gets a worker now, with its deadline (T = min(max(t_min, scale x T_anchor), t_max))."""
        first = request_id in self._complete
        self._complete.discard(request_id)
        self.reward_state, out = self.rewards.submit(self.reward_state, request_id, at, first=first)
        return out

    def scoring_finished(self, request_id: str, reward: float, at: float, failed: bool = False,
                         seconds: float | None = None) -> list:
        """A scorer answered after running `seconds`; a positive reward is a correct execution, which
        may raise T_anchor.  Returns the RewardScored it decided (none for an answer past its
        deadline), then StartScoring for the next waiting samples and the batcher's commands."""
        correct = not failed and reward > 0
        self.reward_state, out = self.rewards.finished(self.reward_state, request_id, reward, correct, at,
                                                       failed, seconds)
        return self._scored(out)

    def expire_rewards(self, at: float) -> list:
        """Fail every scoring whose expiry (`next_reward_expiry`) is <= `at` (reward 0); outputs as
        `scoring_finished`."""
        self.reward_state, out = self.rewards.expire(self.reward_state, at)
        return self._scored(out)

    def hedge_rewards(self, at: float) -> list:
        """The clock reached a StartScoring's `hedge_at`: second copies of the executions due, on
        free workers (`StartScoring(copy=1)`)."""
        self.reward_state, out = self.rewards.hedge(self.reward_state, at)
        return out

    def _scored(self, out: list) -> list:
        result = []
        for item in out:
            result.append(item)
            if isinstance(item, RewardScored):
                result.extend(self.handle(item))
        return result

    def _route(self, commands: list[Command]) -> list[Command]:
        out = list(commands)
        for command in commands:
            if isinstance(command, CloseGroup):  # its samples are the ones the step waits for
                ids = [x.request_id for x in command.samples]
                self.reward_state = self.rewards.promote(self.reward_state, ids)
                self._complete.update(ids)  # (the last ones are submitted after this: start_scoring)
            if isinstance(command, _FOR_BATCHER):
                self.batch_state, more = self.batcher.handle(self.batch_state, command)
                out.extend(more)
        return self._note(out)

    def _note(self, commands: list[Command]) -> list[Command]:
        for command in commands:
            if isinstance(command, StepOptimizer):
                self.step_done = True
                self._committed = self.state
        return commands

    def to_dict(self) -> dict:
        """Checkpoint, valid at any moment: the planner as of the last optimizer step (save it with
        the weights of that step), with the current request counter so ids are never reused.  A
        step interrupted half-way is played again from its start after a restore: its prompts are
        drawn again, none lost, none trained twice."""
        data = self.planner.to_dict(self._committed)
        data["next_request"] = self.state.next_request
        data["reward_anchor"] = self.reward_state.anchor  # the adaptive reward deadline survives a restart
        return data
