"""The RL algorithm's options of the reference trainer, as flat components (their fields are the
top-level flags, declared here only: type, default, validator, docstring as help; see
rollpacker.train.config.assemble): how rollouts are sampled, how a step's groups become advantages
and micro-batches, and the trainer's loss.  Each turns its flags into what its consumer takes
(`loop_options()`, `batcher_config()`, `trainer_fields()`), so no flag is copied by hand on the way."""

from __future__ import annotations

import typing
from typing import Literal

from attrs import field, frozen
from attrs.validators import ge, gt, in_, le, optional

from rollpacker.core import BatcherConfig
from rollpacker.core.advantages import ADVANTAGES
from rollpacker.core.stream_batcher import LOSS_AGGREGATIONS
from rollpacker.core.validators import NUMBER, config_check, flag_name

from .flag_checks import at_least, non_negative_finite, positive_finite
from .memory_plan import MICRO_BATCH_TOKENS

AdvantageName = Literal[ADVANTAGES]  # type: ignore[valid-type]
LossAggregation = Literal[LOSS_AGGREGATIONS]  # type: ignore[valid-type]
assert typing.get_args(AdvantageName) == ADVANTAGES

_top_p = config_check("in (0, 1]", *NUMBER, gt(0), le(1), label=flag_name)


def _one_of(choices: tuple[str, ...]):
    return config_check("one of " + ", ".join(choices), in_(choices), label=flag_name)


@frozen(kw_only=True)
class SamplingOptions:
    """How the rollout samples: --temperature and --top-p."""

    flat = True
    temperature: float = field(default=1.0, validator=config_check(">= 0", *NUMBER, ge(0), label=flag_name))
    """Sampling temperature."""
    top_p: float = field(default=1.0, validator=_top_p)
    """Nucleus sampling threshold."""

    def loop_options(self) -> dict:
        """The live loop's sampling fields (rollpacker.driver.LoopConfig)."""
        return {"temperature": self.temperature, "top_p": self.top_p}


@frozen(kw_only=True)
class BatchingOptions:
    """How a step's complete groups become advantages and micro-batches (the core's stream batcher)."""

    flat = True
    advantage: AdvantageName = field(default="grpo", validator=_one_of(ADVANTAGES))
    """Group advantage estimator."""
    loss_aggregation: LossAggregation = field(default="token-mean", validator=_one_of(LOSS_AGGREGATIONS))
    """How per-token losses are averaged over the step."""
    dynamic_sampling: bool = False
    """DAPO: drop groups whose rewards all agree."""
    micro_batch_tokens: int | None = field(default=None, validator=optional(at_least(1)))
    """Most response tokens per training micro-batch; unset, the run's memory plan picks it: 256 on
    the CPU, on CUDA the largest of 8192, 4096, ..., 256 that fits (`memory_plan.MICRO_BATCH_TOKENS`)."""

    def batcher_config(self) -> BatcherConfig:
        """Unset --micro-batch-tokens is the CPU's size here; the reference trainer sets the plan's pick first."""
        return BatcherConfig(token_budget=self.micro_batch_tokens or MICRO_BATCH_TOKENS["cpu"][0], advantage=self.advantage,
                             loss_aggregation=self.loss_aggregation, dynamic_sampling=self.dynamic_sampling)


@frozen(kw_only=True)
class LossOptions:
    """The policy-gradient loss every trainer computes (rollpacker.backends.trainer.config.TrainerConfig)."""

    flat = True
    clip_eps: float = field(default=0.2, validator=positive_finite)
    """PPO clip range: the ratio pi/pi_old is clipped to [1 - clip_eps, 1 + clip_eps_high]."""
    clip_eps_high: float | None = field(default=None, validator=optional(positive_finite))
    """Upper clip range (DAPO's clip-higher); default: --clip-eps."""
    kl_coef: float = field(default=0.0, validator=non_negative_finite)
    """Weight of the k3 KL estimate to the initial weights (a frozen second copy of the model); 0: none."""
    max_grad_norm: float | None = field(default=1.0, validator=optional(positive_finite))
    """Clip the global gradient norm to this; None: no clipping (the norm is still reported)."""

    def trainer_fields(self) -> dict:
        """TrainerConfig's loss fields."""
        return {"clip_eps": self.clip_eps, "clip_eps_high": self.clip_eps_high, "kl_coef": self.kl_coef,
                "max_grad_norm": self.max_grad_norm}
