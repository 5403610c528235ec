"""One round of the core's planner on a rollout engine, with the prompts TRL's sampler chose.

`fed_state` keeps the core's `PromptPool` supplied with fresh prompts in the order a trainer's own
sampler drew them, instead of the pool's seeded order: a pool whose own order is used up
(cursor at the end, `epochs` = this epoch + 1) draws only the keys given back to it (`returned`),
so feeding an epoch's keys there makes `take` walk the sampler's order, over-launch ahead of it,
and, once the last of them is drawn, the pool is `exhausted` and tail batching plays its long queue
whatever its size.  Every key leaves the pool only by being trained (the planner's guarantee), so
each prompt of the sampler's epoch is trained exactly once, deferred or not.  An epoch's keys are
fed once the previous epoch's are all trained.

`RoundRunner.play` runs a round: it executes the planner's launches and aborts against the engine
(`Sampling.request`), feeds it the engine's results and returns, once the round ended, each trained
prompt's R kept responses (token ids, the engine's log-probs) in sample order and the round's report.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import attrs
from attrs import frozen

from rollpacker.core import AbortRequest, CloseGroup, EndRound, LaunchRequest, PromptKey, RequestAborted, RequestFinished, RoundReport
from rollpacker.core.errors import SchedulerMisuse
from rollpacker.core.planner import RoundPlanner
from rollpacker.core.prompt_pool import PromptPool
from rollpacker.core.protocols import GenerationResult, RolloutEngine
from rollpacker.core.records import replace
from rollpacker.core.round_state import PlannerState
from rollpacker.driver.token_store import TokenStore

from .settings import Sampling


@frozen
class Completion:
    """One trained response: its new token ids and the engine's log-probs of them."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str


@frozen
class PlayedRound:
    kind: str
    """"short" / "long" (tail batching) or "normal"."""
    groups: tuple[tuple[PromptKey, tuple[Completion, ...]], ...]
    """The trained prompts, in the order the round completed them, each with its R responses."""
    report: RoundReport
    seconds: float


def fed_state(state: PlannerState, epoch: int, keys: Sequence[PromptKey]) -> PlannerState:
    """`state` with the keys of a trainer's `epoch` fed to its pool (see the module's docstring);
    the previous epoch's keys must all be trained."""
    pool = state.pool
    pending = len(pool.in_flight) + len(pool.deferred) + len(pool.returned) + len(state.loaded)
    if pending:
        raise SchedulerMisuse(f"epoch {epoch} of TRL's sampler began with {pending} prompt(s) of epoch {pool.epoch} "
                              "not trained yet: TRL's steps per epoch and rollpacker's rounds went out of step")
    if any(k.epoch != epoch for k in keys) or len(set(keys)) != len(keys):
        raise SchedulerMisuse(f"epoch {epoch}: the fed keys must be distinct keys of that epoch")
    pool = attrs.evolve(pool, epoch=epoch, epochs=epoch + 1, cursor=pool.num_prompts, returned=tuple(keys))
    return replace(state, pool=pool)


def initial_state(num_prompts: int, seed: int) -> PlannerState:
    """A planner state whose pool draws only what is fed to it (nothing yet)."""
    return PlannerState(pool=PromptPool(num_prompts=num_prompts, seed=seed, epochs=1, cursor=num_prompts))


class RoundRunner:
    """Plays planner rounds on `engine`; request numbers run on across rounds (and planners)."""

    def __init__(self, engine: RolloutEngine, sampling: Sampling, poll_s: float = 0.05) -> None:
        self.engine = engine
        self.sampling = sampling
        self.poll_s = poll_s
        self.next_request = 0

    def play(self, planner: RoundPlanner, state: PlannerState,
             prompt_ids: Callable[[PromptKey], Sequence[int]]) -> tuple[PlannerState, PlayedRound]:
        """One round from `state`: (the state after it, what it trained)."""
        start = time.perf_counter()
        store, closed = TokenStore(), {}
        state = replace(state, next_request=max(state.next_request, self.next_request))
        state, commands = planner.begin_round(state)
        end = None
        while end is None:
            for command in commands:
                if isinstance(command, CloseGroup):
                    closed[command.prompt] = command.samples
                elif isinstance(command, EndRound):
                    end = command
            self._execute(commands, store, prompt_ids)
            if end is not None:
                break
            commands = []
            for result in self.engine.poll(timeout=self.poll_s):
                if isinstance(result, GenerationResult):
                    store.add(result)
                    state, more = planner.handle(state, _event(result))
                    commands.extend(more)
        self.next_request = state.next_request
        groups = tuple((key, tuple(_completion(store, s) for s in sorted(closed[key], key=lambda s: s.sample_index)))
                       for key in end.trained)
        return state, PlayedRound(end.kind, groups, end.report, time.perf_counter() - start)

    def _execute(self, commands, store: TokenStore, prompt_ids) -> None:
        launches = [c for c in commands if isinstance(c, LaunchRequest)]
        if launches:
            self.engine.submit([self.sampling.request(c, prompt_ids(c.prompt), store.response_ids(c.resume))
                                for c in launches])
        aborts = [c.request_id for c in commands if isinstance(c, AbortRequest)]
        if aborts:
            self.engine.abort(aborts)


def _event(result: GenerationResult) -> RequestFinished | RequestAborted:
    n = len(result.token_ids)
    if result.finish_reason == "abort":
        return RequestAborted(result.request_id, n, result.at)
    return RequestFinished(result.request_id, n, result.finish_reason, result.at)


def _completion(store: TokenStore, sample) -> Completion:
    return Completion(store.response_ids(sample.segments), store.logprobs(sample.segments), sample.finish_reason)
