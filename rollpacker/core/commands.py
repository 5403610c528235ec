"""Commands: what the core asks the driver to do, as imperatives.  The driver executes them against a
backend (rollout engine, reward executor, trainer) and feeds back the resulting events.
"""

from __future__ import annotations

from attrs import frozen

from .records import PromptKey, Sample, Segment


def sibling_group(prompt: PromptKey) -> str:
    """The engine's sibling group (`GenerationRequest.group`) of every request of `prompt`, in any
    epoch and any round: their responses are siblings, which an engine may use as speculative
    drafts for each other."""
    return f"p{prompt.index}"


@frozen
class LaunchRequest:
    """Start generating one sample of `prompt` under policy `policy_version`.

    `resume` is the prefix this request continues (partial rollout): the driver appends the token
    ids of those segments' requests to the prompt; `max_new_tokens` already excludes them.
    """

    request_id: str
    prompt: PromptKey
    sample_index: int
    max_new_tokens: int
    policy_version: int
    seed: int
    """The engine samples this request with this seed (`records.sampling_seed` of the run's seed and
    the request number): distinct within a group, so its R samples differ; the same on a rerun."""
    resume: tuple[Segment, ...] = ()

    @property
    def sibling_group(self) -> str:
        """`sibling_group(self.prompt)`: the same for every request of this prompt."""
        return sibling_group(self.prompt)


@frozen
class SetTensorParallel:
    """Run the rollout from now on at tensor-parallel size `tp` (GPUs / tp engine instances): comes
    before the round's launches, from a Scheduler given a `TpRule`, when the TP changes."""

    tp: int


@frozen
class AbortRequest:
    """Abort a running request; the engine answers with `RequestAborted` (partial token count)."""

    request_id: str


@frozen
class ScoreSample:
    """The planner keeps this finished response for training: score it (answer: `RewardScored`)."""

    sample: Sample


@frozen
class StartScoring:
    """Run the scorer of `request_id` now (the core's reward scheduler gave it a worker); the core
    gives up on it at `deadline` (answer: `scoring_finished`, or `expire_rewards` once the clock
    passed `Scheduler.next_reward_expiry`)."""

    request_id: str
    deadline: float
    """The core's time at which the sample's scoring ends: its adaptive timeout past its first
    start, shared by every copy."""
    at: float
    """The core's time of this start."""
    queued_s: float = 0.0
    """How long the sample waited for a worker (since `start_scoring`)."""
    copy: int = 0
    """0: the sample's execution; k >= 1: a hedge, one more execution of a slow one (same deadline):
    the first answer of any is the sample's."""
    hedge_at: float | None = None
    """When this execution is due for a hedge (the driver then calls `Scheduler.hedge_rewards`);
    None: never (hedging off, a copy, or not before the deadline)."""

    @property
    def time_limit(self) -> float:
        """How long this execution may run: from its start to the deadline.  What an executor that
        times a job from its own start is given (`RewardJob.deadline_s`)."""
        return self.deadline - self.at


@frozen
class CloseGroup:
    """All samples of `prompt`'s group are kept for this step (rewards may still be pending)."""

    prompt: PromptKey
    samples: tuple[Sample, ...]


@frozen
class TrainSampleRef:
    """One sample of a micro-batch: which response, its advantage, and its per-token loss weight."""

    sample: Sample
    advantage: float
    token_weight: float
    """Multiplies the per-token loss of every response token of this sample (see StreamBatcher)."""


@frozen
class TrainMicroBatch:
    """Run forward/backward on these samples and accumulate gradients (no optimizer step)."""

    step: int
    index: int
    samples: tuple[TrainSampleRef, ...]

    @property
    def num_tokens(self) -> int:
        return sum(s.sample.num_tokens for s in self.samples)


@frozen
class StepOptimizer:
    """Divide the accumulated gradient by `loss_normalizer`, then step the optimizer once.

    With the weights of the micro-batches, sum(micro-batch gradients) / loss_normalizer equals the
    gradient of the full-batch loss (StreamBatcher states the aggregation).
    """

    step: int
    loss_normalizer: float
    num_samples: int
    num_tokens: int
    num_micro_batches: int
    dropped_groups: tuple[PromptKey, ...] = ()
    """Groups filtered out by DAPO dynamic sampling this step (zero reward variance)."""


@frozen
class EndRound:
    """The round (rollout part of a step) is over: every request of it has finished or been aborted.

    `trained` are the prompts whose groups this step trains; the report carries the round's token
    accounting.  After this the driver waits for the optimizer step, syncs weights, and begins the
    next round.
    """

    step: int
    kind: str
    """"short", "long" (tail batching), or "normal" (every other round)."""
    trained: tuple[PromptKey, ...]
    report: "RoundReport"
    carried_requests: tuple[str, ...] = ()
    """Requests whose tokens a later round resumes or trains (partial modes): keep their token
    ids; every other request's tokens may be freed once this step is trained."""


@frozen
class RoundReport:
    """Token and prompt accounting of one round."""

    step: int
    kind: str
    launched_requests: int
    generated_tokens: int
    """Tokens generated by this round's requests (kept, carried or wasted)."""
    kept_tokens: int
    """Tokens of samples trained this step (including resumed prefixes from earlier rounds)."""
    wasted_tokens: int
    """Tokens generated and thrown away (aborted, dropped as stale, or over-sampled)."""
    carried_tokens: int
    """Tokens kept for a later round (partial modes)."""
    offpolicy_tokens: int
    """Trained tokens produced by an older policy version."""
    staleness: tuple[tuple[int, int], ...]
    """Histogram of trained tokens by lag: ((lag, tokens), ...)."""
    trained_prompts: int
    deferred_prompts: int
    returned_prompts: int
    mean_kept_length: float
    mean_generated_length: float
    """Mean length of every request that ended this round, kept or not, aborted ones at their cut
    length: against mean_kept_length it shows the group length bias."""
    retried_requests: int = 0


Command = (
    SetTensorParallel | LaunchRequest | AbortRequest | ScoreSample | StartScoring | CloseGroup | TrainMicroBatch
    | StepOptimizer | EndRound
)
