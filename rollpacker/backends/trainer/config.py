"""What every GRPO trainer backend is configured with (TorchTitan's and plain PyTorch's), checked
on construction.  No torch import: the driver can build and check a config before any model loads."""

from __future__ import annotations

import os

from attrs import field, frozen
from attrs.validators import ge, gt, in_, instance_of

from rollpacker.core.errors import ConfigError

TRAINER_DTYPES = ("float32", "bfloat16")


def _betas(instance, attribute, value) -> None:
    if len(value) != 2 or not all(0.0 <= b < 1.0 for b in value):
        raise ConfigError(f"{type(instance).__name__}.betas must be two floats in [0, 1), got {value!r}")


@frozen(kw_only=True)
class TrainerConfig:
    """The fields and checks both trainers share; each backend's config adds its own."""

    model_dir: str = field(converter=os.fspath)
    """A Hugging Face checkpoint directory: config.json plus *.safetensors (Llama or Qwen3)."""
    lr: float = field(default=1e-6, validator=ge(0.0))
    """AdamW learning rate (constant: the driver owns any schedule); 0 keeps the weights fixed."""
    betas: tuple[float, float] = field(default=(0.9, 0.999), converter=tuple, validator=_betas)
    """AdamW betas."""
    eps: float = field(default=1e-8, validator=gt(0.0))
    """AdamW epsilon."""
    weight_decay: float = field(default=0.0, validator=ge(0.0))
    """AdamW decoupled weight decay."""
    max_grad_norm: float | None = field(default=1.0)
    """Clip the global gradient norm (after division by the loss normaliser) to this; None: no
    clipping (the norm is still reported)."""
    clip_eps: float = field(default=0.2, validator=gt(0.0))
    """PPO clip range: the ratio pi/pi_old is clipped to [1 - clip_eps, 1 + clip_eps_high]."""
    clip_eps_high: float | None = None
    """Upper clip range (DAPO's clip-higher); None: same as clip_eps."""
    use_rollout_logprobs: bool = True
    """Use TrainSample.old_logprobs (the rollout engine's) as the old policy when present; False
    always takes the trainer's own log-probs under the current weights (engine numerics differ,
    e.g. bf16 sampling against a float32 trainer)."""
    kl_coef: float = field(default=0.0, validator=ge(0.0))
    """Weight of the k3 KL estimate to the reference policy (the initial weights); 0 turns the
    reference model off entirely (no second copy of the weights is built)."""
    dtype: str = field(default="float32", validator=in_(TRAINER_DTYPES))
    """Compute dtype.  Parameters, gradients and AdamW's state are float32 either way (bfloat16: the
    forward and backward run under autocast over float32 master weights; export_weights gives
    bfloat16 copies, for the engine)."""
    max_forward_tokens: int | None = field(default=None)
    """Most padded tokens (rows x longest row, prompt included) in one forward: a micro-batch that
    pads to more runs as several forwards whose gradients add up (the loss is a sum); None: one
    forward per micro-batch.  The run sets it from its memory plan, which counts exactly this."""
    response_logits_only: bool = field(default=True, validator=instance_of(bool))
    """Run the LM head only at the positions that predict a response token, the only ones the loss
    reads (a prompt's positions get log-prob 0); False: at every position, as before this existed
    (kept to measure what it saves: benchmarks/response_logits.py)."""
    seed: int = field(default=0, validator=instance_of(int))
    """Seed of torch's RNG on every rank (the loss itself is deterministic: no dropout)."""
    device: str | None = None
    """"cpu" or "cuda"; None: cuda when available, else cpu."""

    def __attrs_post_init__(self) -> None:
        name = type(self).__name__
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ConfigError(f"{name}.max_grad_norm must be > 0 or None, got {self.max_grad_norm!r}")
        if self.clip_eps_high is not None and not self.clip_eps_high > 0:
            raise ConfigError(f"{name}.clip_eps_high must be > 0 or None, got {self.clip_eps_high!r}")
        if self.max_forward_tokens is not None and not (isinstance(self.max_forward_tokens, int)
                                                        and self.max_forward_tokens >= 1):
            raise ConfigError(f"{name}.max_forward_tokens must be an int >= 1 or None, got {self.max_forward_tokens!r}")
        if self.device not in (None, "cpu", "cuda"):
            raise ConfigError(f"{name}.device must be 'cpu', 'cuda' or None, got {self.device!r}")

    @property
    def clip_high(self) -> float:
        """The upper clip range in effect."""
        return self.clip_eps_high if self.clip_eps_high is not None else self.clip_eps
