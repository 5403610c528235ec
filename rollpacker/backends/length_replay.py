"""Length replay: a real rollout engine whose requests end at the lengths a trace gives them.

`LengthReplay` wraps any `RolloutEngine`.  The k-th fresh request of prompt p (its sibling group
`p{p}`) is given the k-th length of p in a simulator workload (`rollpacker.sim.workloads`: a built-in
trace with its modelled prompt structure, or a JSONL of per-prompt lengths), the same draw the
simulator makes for that prompt's k-th sample.  The engine enforces it: the request goes out with its
`max_new_tokens` cut to the trace length and `ignore_eos`, so the engine decodes real tokens for
exactly that long.  A request that ends there comes back with finish reason "stop" (it ended "on
its own"), or "length" when the trace length reaches the run's cap, as the simulator reports them; an
abort comes back as the engine made it.  A resumed request (partial rollout) continues its first
request's length.

Nothing of the trace reaches the core: the scheduler and its policy see the same launches, events
and lengths-after-the-fact as in any run, so a policy cannot schedule by lengths it was not told
(tests/test_length_replay.py checks that nothing reachable from a policy's inputs holds the trace).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from rollpacker.core.errors import ConfigError
from rollpacker.core.protocols import GenerationProgress, GenerationRequest, GenerationResult, RolloutEngine


@attrs.frozen
class Target:
    """What the replay asked of one request: its sample's whole length, this request's share, and
    what it continues (its group and resumed tokens)."""

    total: int
    new: int
    group: str | None
    prefix: tuple[int, ...]


class LengthReplay:
    """`engine` with every request cut at its trace length (see the module doc).  `workload` draws
    lengths (`sample(prompt, step)`, already cut at `max_tokens`)."""

    def __init__(self, engine: RolloutEngine, workload, max_tokens: int) -> None:
        self.engine = engine
        self._workload = workload
        self._max_tokens = max_tokens
        self._targets: dict[str, Target] = {}
        self._prefixes: dict[tuple[str, tuple[int, ...]], int] = {}
        """(group, response tokens so far) of an aborted request -> its sample's total: a resume's length."""

    def __getattr__(self, name: str):  # everything else is the engine's (weight sync, stats, drafts)
        if name == "engine":
            raise AttributeError(name)
        return getattr(self.engine, name)

    @property
    def capacity(self) -> int:
        return self.engine.capacity

    def submit(self, requests: Sequence[GenerationRequest]) -> None:
        self.engine.submit([self._replayed(r) for r in requests])

    def _replayed(self, request: GenerationRequest) -> GenerationRequest:
        prompt = prompt_index(request)
        done = len(request.resume_ids)
        if done:
            key = (request.group, tuple(request.resume_ids))
            if key not in self._prefixes:
                raise ConfigError(f"length replay: request {request.request_id!r} resumes tokens no earlier "
                                  f"request of its prompt produced")
            total = self._prefixes[key]
        else:
            total = self._workload.sample(prompt, 0)
        new = max(1, min(request.max_new_tokens, total - done))
        self._targets[request.request_id] = Target(total, new, request.group, tuple(request.resume_ids))
        return attrs.evolve(request, max_new_tokens=new, ignore_eos=True)

    def poll(self, timeout: float | None = None) -> list[GenerationProgress | GenerationResult]:
        return [self._reported(out) if isinstance(out, GenerationResult) else out
                for out in self.engine.poll(timeout)]

    def _reported(self, result: GenerationResult) -> GenerationResult:
        target = self._targets.pop(result.request_id, None)
        if target is None or result.finish_reason != "length" or len(result.token_ids) < target.new:
            if target is not None and result.finish_reason == "abort":
                self._remember(result, target)
            return result
        reason = "length" if target.total >= self._max_tokens else "stop"
        return attrs.evolve(result, finish_reason=reason)

    def _remember(self, result: GenerationResult, target: Target) -> None:
        """An aborted request's tokens, so a partial rollout resuming them continues its length."""
        self._prefixes[(target.group, target.prefix + tuple(result.token_ids))] = target.total

    def abort(self, request_ids: Sequence[str]) -> None:
        self.engine.abort(request_ids)

    def pause(self) -> None:
        self.engine.pause()

    def resume(self) -> None:
        self.engine.resume()

    def update_weights(self, weights, version: int) -> None:
        self.engine.update_weights(weights, version)

    def close(self) -> None:
        self.engine.close()


def prompt_index(request: GenerationRequest) -> int:
    """The dataset index of a request's prompt, from its sibling group (`core.commands.sibling_group`)."""
    group = request.group or ""
    if not (group.startswith("p") and group[1:].isdigit()):
        raise ConfigError(f"length replay: request {request.request_id!r} has no prompt group (group "
                          f"{request.group!r}); replay needs the driver's requests, which name their prompt")
    return int(group[1:])
