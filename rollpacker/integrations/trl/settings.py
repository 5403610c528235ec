"""What a TRL run asks of rollpacker, and what it cannot have.

`RolloutSettings` is the policy (sync, oversample, tail, sorted) with its knobs and the rollout
engine (the embedded one by default, SGLang servers by URL).  `check_args` refuses, before any model
is loaded or engine started, each TRL argument the integration cannot honour, with a `TrlUnsupported`
naming it: one rollout round makes one optimizer step on one process, so gradient accumulation,
several generation batches per step, several processes, TRL's own vLLM generation and reused
generations (`num_iterations`) would each train something other than what the round produced.
`Sampling` is TRL's sampling arguments as our engines' request fields.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from attrs import field, frozen

from rollpacker.core import LaunchRequest, make_policy
from rollpacker.core.errors import ConfigError
from rollpacker.core.protocols import GenerationRequest
from rollpacker.core.validators import optional_positive, positive_number


class TrlUnsupported(ConfigError):
    """A TRL argument (or a use of GRPOTrainer) that rollpacker's rollout cannot honour; the message
    names it and says what to set instead."""


POLICIES = ("sync", "oversample", "tail", "sorted")
"""sync: TRL's own (P prompts x R, wait for all); oversample: the first R of ceil(eta_responses x R)
responses of each prompt (tail batching without prompt deferral); tail: RollPacker's tail batching
with prompt deferral; sorted: SortedRL's length-sorted batches (on-policy mode)."""
DEFERRING = ("tail", "sorted")
"""Policies that train a prompt in a later step than TRL's sampler drew it in: they need
`RollpackerGRPOTrainer` (the `rollout_func` hook must answer for exactly the prompts it is given)."""


@frozen(kw_only=True)
class RolloutSettings:
    policy: str = field(default="tail")
    """One of POLICIES."""
    knobs: Mapping[str, Any] = field(factory=dict)
    """The policy's knobs (`rollpacker.core.policy_knobs(name)`), e.g. {"eta_prompts": 1.5}."""
    sglang_urls: Sequence[str] = ()
    """Generate on these SGLang servers (they must serve the trained model); empty: the embedded engine."""
    engine_capacity: int | None = field(default=None, validator=optional_positive)
    """Embedded engine: most requests decoded at once (None: all of the largest round at once)."""
    poll_s: float = field(default=0.05, validator=positive_number)
    """How long one poll of the engine waits for a result."""

    def __attrs_post_init__(self) -> None:
        if self.policy not in POLICIES:
            hint = " (partial rollouts train off-policy tokens, which TRL's loss does not correct)" \
                if self.policy == "partial" else ""
            raise TrlUnsupported(f"policy {self.policy!r} is not available with TRL{hint}; choose one of "
                                 f"{', '.join(POLICIES)}")
        if self.policy == "sorted" and self.knobs.get("mode", "on_policy") != "on_policy":
            raise TrlUnsupported("sorted mode 'partial' trains off-policy tokens, which TRL's loss does not "
                                 "correct: use mode='on_policy'")

    @property
    def defers(self) -> bool:
        return self.policy in DEFERRING

    def build_policy(self, prompts: int, samples: int, max_tokens: int):
        """The core policy for P=`prompts`, R=`samples`, L=`max_tokens` (TRL's batch / num_generations,
        num_generations, max_completion_length)."""
        knobs = dict(self.knobs)
        name = self.policy
        if name == "oversample":
            if knobs.setdefault("eta_prompts", 1.0) != 1.0:
                raise TrlUnsupported("oversample launches every prompt of the step (eta_prompts=1.0); "
                                     "policy='tail' over-launches prompts")
            name = "tail"
        return make_policy(name, prompts=prompts, samples=samples, max_tokens=max_tokens, **knobs)


def check_args(args, *, world_size: int, hooked: bool, settings: RolloutSettings) -> None:
    """Raise `TrlUnsupported` for the first GRPOConfig argument rollpacker's rollout cannot honour.
    `hooked`: used through `rollout_func` on a plain GRPOTrainer (no deferral possible)."""
    per_step = args.per_device_train_batch_size
    problems = [
        (world_size > 1, f"{world_size} processes (world size {world_size}): the rollout runs on one process; "
                         "launch one process (no torchrun / accelerate launch with several)"),
        (args.gradient_accumulation_steps != 1,
         f"gradient_accumulation_steps={args.gradient_accumulation_steps}: one round makes one optimizer step; "
         "set gradient_accumulation_steps=1 and raise per_device_train_batch_size instead"),
        (args.generation_batch_size != per_step,
         f"generation_batch_size={args.generation_batch_size} (steps_per_generation={args.steps_per_generation}) "
         f"is not the per-step batch ({per_step}): one round makes one optimizer step; leave "
         "generation_batch_size and steps_per_generation unset"),
        (args.num_iterations != 1, f"num_iterations={args.num_iterations}: each round is trained once; "
                                   "set num_iterations=1"),
        (args.use_vllm, "use_vllm=True: rollpacker's engine generates; set use_vllm=False (to generate on "
                        "servers, pass RolloutSettings(sglang_urls=...))"),
        (getattr(args, "use_transformers_continuous_batching", False),
         "use_transformers_continuous_batching=True: rollpacker's engine generates; set it False"),
        (args.min_p is not None, f"min_p={args.min_p}: our engines sample with temperature, top_p and top_k "
                                 "only; set min_p=None"),
        (args.repetition_penalty != 1.0, f"repetition_penalty={args.repetition_penalty}: our engines have no "
                                         "repetition penalty; set 1.0"),
        (bool(set(args.generation_kwargs or {}) - {"do_sample"}),
         f"generation_kwargs keys {sorted(set(args.generation_kwargs or {}) - {'do_sample'})}: only "
         "'do_sample' (False: greedy) reaches our engines"),
        (hooked and settings.defers,
         f"policy {settings.policy!r} trains some prompts in a later step than TRL's sampler drew them, which "
         "rollout_func cannot do (it must answer for the prompts it is given): use RollpackerGRPOTrainer"),
    ]
    for failed, why in problems:
        if failed:
            raise TrlUnsupported(f"rollpacker with TRL: {why}")


@frozen(kw_only=True)
class Sampling:
    """TRL's sampling arguments as `GenerationRequest` fields."""

    temperature: float
    top_p: float
    top_k: int | None
    stop_token_ids: tuple[int, ...]

    @classmethod
    def of(cls, trainer) -> Sampling:
        args = trainer.args
        greedy = (args.generation_kwargs or {}).get("do_sample", True) is False
        return cls(temperature=0.0 if greedy else float(args.temperature), top_p=float(args.top_p),
                   top_k=int(args.top_k) if args.top_k else None,
                   stop_token_ids=tuple(int(t) for t in trainer.eos_token_ids))

    def request(self, launch: LaunchRequest, prompt_ids: Sequence[int], resume_ids: Sequence[int] = ()) -> GenerationRequest:
        return GenerationRequest(
            request_id=launch.request_id, prompt_ids=tuple(prompt_ids), max_new_tokens=launch.max_new_tokens,
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, seed=launch.seed,
            resume_ids=tuple(resume_ids), group=launch.sibling_group, stop_token_ids=self.stop_token_ids)
