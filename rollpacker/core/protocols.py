"""The contracts backends implement.  Data types here are plain frozen records (no torch), so the
core can name them; the engines, trainers and reward executors (and the simulator) implement the
Protocols.

Rollout engine
    `submit` requests with our own ids; `poll` returns progress and results as they happen;
    `abort(ids)` makes each aborted request come back from `poll` as a `GenerationResult` with
    finish_reason "abort" and the tokens generated so far; `pause`/`resume` bracket a weight update;
    `update_weights` takes HF-named tensors (or a safetensors directory) and a version number.
    Every submitted request produces exactly one `GenerationResult`, whatever happens.

Releasable rollout engine (colocated mode: rollout and training take turns on the same GPUs)
    `release_memory(tags)` frees the engine's memory while nothing is in flight: "weights" (their
    contents are lost) and "kv_cache" (SGLang's tags; None: both).  `resume_memory(tags)` allocates
    them again; resumed weights hold nothing until the next `update_weights`, and generating while
    any memory is released (or before that update) is a `BackendMisuse`.

Draft-keeping rollout engine (speculation that copies from a prompt's earlier requests)
    `keep_draft_groups(groups)`: the driver names, after each step, the sibling groups of the
    prompts drawn and not yet trained (a deferred prompt's next round drafts from its requests of
    the round that deferred it); the engine keeps those groups' text until a later call drops them.

Trainer
    `forward_backward(micro_batch)` accumulates gradients of sum_i w_i * sum_t loss_it (no mean);
    `optimizer_step(loss_normalizer)` divides the accumulated gradients by it and steps once;
    `export_weights()` returns full tensors with HF names for the rollout engine.

Reward executor
    `submit(job)` scores one response asynchronously with a deadline; `poll` returns outcomes;
    a scorer that raises, hangs past the deadline or returns NaN yields a failed outcome, reward 0.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from attrs import field, frozen
from attrs.validators import ge, gt, in_, optional

from rollpacker.core.errors import ConfigError

ENGINE_FINISH_REASONS = ("stop", "length", "abort")


@frozen
class GenerationRequest:
    """One sample to generate.  `resume_ids` are response tokens generated earlier (partial
    rollout): the engine continues after prompt_ids + resume_ids, and `max_new_tokens` counts only
    the new tokens."""

    request_id: str
    prompt_ids: tuple[int, ...]
    max_new_tokens: int = field(validator=ge(1))
    temperature: float = field(default=1.0, validator=ge(0.0))
    top_p: float = field(default=1.0, validator=[gt(0.0)])
    seed: int | None = None
    resume_ids: tuple[int, ...] = ()
    group: str | None = None
    """Requests with the same group are samples of the same prompt (siblings); an engine may use
    their text to draft speculative tokens for each other.  None: no siblings known."""
    top_k: int | None = field(default=None, validator=optional(ge(1)))
    """Sample among the k most likely tokens only (with top_p, both cuts apply).  None: no cut."""
    stop_token_ids: tuple[int, ...] = ()
    """More tokens that end the request with "stop" (kept as its last token), besides the engine's own."""
    stop: tuple[str, ...] = ()
    """Strings that end the request with "stop" once the response text holds one (the engine needs
    a tokenizer to see text)."""
    ignore_eos: bool = False
    """The engine's own stop tokens (EOS) do not end this request (SGLang's sampling param of that
    name): it runs to `max_new_tokens` unless `stop_token_ids` or `stop` end it."""


@frozen
class GenerationProgress:
    """A running request has produced `num_tokens` new tokens so far."""

    request_id: str
    num_tokens: int
    at: float


@frozen
class GenerationResult:
    """The end of a request: the new tokens (not the resumed prefix), their log-probs under the
    policy that sampled them, and why it ended."""

    request_id: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str = field(validator=in_(ENGINE_FINISH_REASONS))
    weight_version: int
    at: float
    way_back_s: float | None = None
    """Seconds from the engine's end of the request to this result (`at`), where the engine's server reports
    its own times (SGLang with --enable-metrics); None where it does not."""
    way_in_s: float | None = None
    """Seconds from the request's sending to the engine's queue having it, where the server says (as `way_back_s`)."""


@runtime_checkable
class RolloutEngine(Protocol):
    """What the planners need from an inference engine (embedded, SGLang, simulator)."""

    @property
    def capacity(self) -> int:
        """How many requests it can run at once (its running batch limit)."""

    def submit(self, requests: Sequence[GenerationRequest]) -> None: ...

    def poll(self, timeout: float | None = None) -> list[GenerationProgress | GenerationResult]:
        """Wait up to `timeout` seconds (None: until something happens) and return what happened."""

    def abort(self, request_ids: Sequence[str]) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def update_weights(self, weights: Mapping[str, Any] | str | os.PathLike, version: int) -> None: ...

    def close(self) -> None: ...


MEMORY_TAGS = ("weights", "kv_cache")
"""What `release_memory` / `resume_memory` free and allocate again (SGLang's tag names)."""


def check_memory_tags(tags: Sequence[str] | None) -> tuple[str, ...]:
    """The tags asked for (None: all), each one of `MEMORY_TAGS`, in that order; else a ConfigError."""
    if tags is None:
        return MEMORY_TAGS
    if isinstance(tags, str) or not isinstance(tags, Sequence) or not all(isinstance(t, str) for t in tags):
        raise ConfigError(f"memory tags must be a list of strings from {list(MEMORY_TAGS)}, got {tags!r}")
    unknown = [t for t in tags if t not in MEMORY_TAGS]
    if unknown:
        raise ConfigError(f"unknown memory tag(s) {unknown}: the tags are {list(MEMORY_TAGS)}")
    return tuple(t for t in MEMORY_TAGS if t in tags)


@runtime_checkable
class ReleasableEngine(RolloutEngine, Protocol):
    """A rollout engine that can give its memory back while a colocated trainer runs."""

    def release_memory(self, tags: Sequence[str] | None = None) -> None:
        """Free the memory of `tags` (None: all of `MEMORY_TAGS`); nothing may be in flight."""

    def resume_memory(self, tags: Sequence[str] | None = None) -> None:
        """Allocate the memory of `tags` again (None: every released one)."""


@runtime_checkable
class DraftKeepingEngine(RolloutEngine, Protocol):
    """A rollout engine whose speculative drafter copies from earlier requests of the same group
    (`GenerationRequest.group`: a finished or aborted sibling stays a source) and can be told which
    groups have requests still to come, so that none of them is forgotten in between."""

    def keep_draft_groups(self, groups: Collection[str]) -> None:
        """Keep the finished and aborted requests of `groups` as draft sources, however many other
        groups run meanwhile, until a later call leaves a group out (each call replaces the set)."""


@frozen
class TrainSample:
    """One response of a micro-batch, as token ids: prompt + response, advantage, per-token weight,
    and optionally the rollout policy's log-probs of the response tokens (old log-probs)."""

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    advantage: float
    token_weight: float
    old_logprobs: tuple[float, ...] | None = None


@frozen
class MicroBatch:
    samples: tuple[TrainSample, ...]


@frozen
class TrainStats:
    """What one forward/backward or optimizer step measured."""

    loss_sum: float
    """Weighted sum of per-token losses (divide by the step's loss_normalizer for the loss)."""
    num_tokens: int
    entropy_sum: float = 0.0
    clip_fraction: float = 0.0
    grad_norm: float | None = None
    forwards: int = 0
    """Padded forwards a micro-batch took (the trainer splits one that pads past its forward budget)."""
    padded_tokens: int = 0
    """Their rows x padded width, prompts included: against num_tokens, what padding and prompts cost."""


@runtime_checkable
class Trainer(Protocol):
    def forward_backward(self, batch: MicroBatch) -> TrainStats: ...

    def optimizer_step(self, loss_normalizer: float) -> TrainStats: ...

    def export_weights(self) -> dict[str, Any]: ...

    def save(self, path: str | os.PathLike) -> None: ...

    def load(self, path: str | os.PathLike) -> None: ...


@frozen
class RewardJob:
    """Score one response: `task` names the scorer, `entry` is the task's own record (picklable)."""

    request_id: str
    task: str
    entry: Any
    response: str
    deadline_s: float = 10.0
    """Seconds the scorer may run, counted from the executor's start of the job (the live driver
    gives each job its `StartScoring.time_limit`)."""
    copy: int = 0
    """0: the sample's execution; k >= 1: a hedge (StartScoring.copy), in flight beside it."""


REWARD_STATUSES = ("ok", "error", "timeout", "nan")


@frozen
class RewardOutcome:
    request_id: str
    reward: float
    status: str = field(validator=in_(REWARD_STATUSES))
    latency_s: float = 0.0
    """Time the scorer ran."""
    queue_s: float = 0.0
    """Time the job waited for a worker."""
    error: str = ""
    copy: int = 0
    """The job's copy (RewardJob.copy)."""

    @property
    def failed(self) -> bool:
        return self.status != "ok"


@runtime_checkable
class RewardExecutor(Protocol):
    def submit(self, job: RewardJob) -> None: ...

    def cancel(self, request_id: str) -> None:
        """Withdraw the jobs of `request_id` still in flight (a hedged sample answered): no outcome
        comes for them.  Called only for a sample whose scoring the core hedged."""

    def poll(self, timeout: float | None = None) -> list[RewardOutcome]: ...

    def close(self) -> None: ...


@runtime_checkable
class LateStartingRewardExecutor(RewardExecutor, Protocol):
    """A reward executor that may start a job later than its submission (its pool waits for a
    worker process, such as one started in place of a worker killed at a deadline) and times a job
    out by `RewardJob.deadline_s` counted from that start, answering with status "timeout"."""

    @property
    def start_grace_s(self) -> float:
        """How late a submitted job may start: the core's own expiry waits this long past a
        deadline, so that a scoring that waited for a worker is not cut before it ran."""
