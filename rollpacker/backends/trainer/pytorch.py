"""The plain PyTorch trainer backend: GRPO on the Hugging Face model itself, where TorchTitan cannot
run (TorchTitan 0.3.0 needs torch >= 2.13, or 2.11 with titan.compat's stand-ins).

    trainer = TorchTrainer(TorchTrainerConfig(model_dir="ckpt/", lr=1e-6))
    for mb in micro_batches:                    # streamed: one at a time, as groups complete
        trainer.forward_backward(mb)            # accumulates d/dtheta sum_i w_i sum_t loss_it
    trainer.optimizer_step(loss_normalizer)     # grads /= normaliser, clip, one AdamW step
    engine.update_weights(trainer.export_weights(), version)   # HF names, full tensors

Same contract and step logic as `TitanTrainer` (both are `PolicyTrainer`s over `trainer.loss`).  One
process trains on one device.  Under torchrun with WORLD_SIZE > 1 every decoder layer and then the
whole model are sharded with FSDP2 (`torch.distributed.fsdp.fully_shard`, gloo on CPU, nccl on
CUDA) with FSDP's gradient division turned off, so gradients are sums over ranks; each rank trains
a token-balanced share of every micro-batch.

The model is wrapped in `PolicyLogprobs`, whose forward runs the HF decoder and then the LM head
chunk by chunk (`chunked_token_logprobs_and_entropy`): a micro-batch's logits never exist whole.
The wrapper is FSDP's root, so the embedding, final norm and LM head are gathered once per forward.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from attrs import field, frozen

from rollpacker.backends.errors import InvalidMicroBatch
from rollpacker.backends.trainer.loss import chunked_token_logprobs_and_entropy
from rollpacker.backends.models import read_config_json
from rollpacker.backends.trainer.policy import (PolicyTrainer, default_device, force_sum_reduction, full_cpu,
                                                full_tensor, init_process_group, select_device)
from rollpacker.backends.trainer.config import TrainerConfig
from rollpacker.core.errors import ConfigError

__all__ = ["InvalidMicroBatch", "PolicyLogprobs", "TorchTrainer", "TorchTrainerConfig"]

_PREFIX = "hf."  # PolicyLogprobs holds the HF model as `hf`; exported names drop it


def _positive(instance, attribute, value) -> None:
    if not isinstance(value, int) or value < 1:
        raise ConfigError(f"TorchTrainerConfig.{attribute.name} must be an int >= 1, got {value!r}")


@frozen(kw_only=True)
class TorchTrainerConfig(TrainerConfig):
    """Everything the plain PyTorch trainer needs; one instance per rank, identical on all ranks.
    The optimizer, loss, dtype, seed and device fields are TrainerConfig's (as TitanConfig's)."""

    logits_chunk_tokens: int = field(default=1024, validator=_positive)
    """Positions whose logits are computed (and recomputed in backward) at once: the LM head's
    peak memory is chunk x vocab floats instead of the micro-batch's tokens x vocab."""


class PolicyLogprobs(torch.nn.Module):
    """forward(input_ids, targets) -> (log p(target), entropy), [B, L] float32 each, of an HF causal
    LM whose logits are `lm_head(decoder(x))` (Llama, Qwen); inputs are right-padded, attention is
    causal, so padding never reaches a real token."""

    def __init__(self, hf, chunk_tokens: int) -> None:
        super().__init__()
        self.hf = hf
        self.chunk_tokens = chunk_tokens

    def forward(self, input_ids, targets, mask=None):
        """With a [B, L] bool `mask`, the LM head runs only at its True positions (0 elsewhere)."""
        hidden = self.hf.get_decoder()(input_ids=input_ids, use_cache=False).last_hidden_state
        head = self.hf.get_output_embeddings()
        return chunked_token_logprobs_and_entropy(hidden, head.weight, targets, chunk_tokens=self.chunk_tokens,
                                                  mask=mask)


class TorchTrainer(PolicyTrainer):
    """Implements rollpacker.core.protocols.Trainer on the HF model (FSDP2 when WORLD_SIZE > 1)."""

    def __init__(self, config: TorchTrainerConfig):
        import torch.distributed as dist

        self.config = config
        hf_config = read_config_json(config.model_dir)  # fail on a bad directory before loading
        _check_logits_are_a_plain_head(config.model_dir, hf_config)
        self.device_type = config.device or default_device()
        if int(os.environ.get("WORLD_SIZE", 1)) > 1:
            init_process_group(self.device_type, world_of_one=False)
        self.dp_size = dist.get_world_size() if dist.is_initialized() else 1
        self.rank = self.dp_rank = dist.get_rank() if dist.is_initialized() else 0
        self.device = select_device(self.device_type)
        self.pad_multiple = 1
        torch.manual_seed(config.seed)

        self.model = self._build_model(trainable=True)
        self.ref_model = self._build_model(trainable=False) if config.kl_coef > 0 else None
        self.vocab_size = self.model.hf.get_output_embeddings().weight.shape[0]
        self.max_seq_len = int(hf_config.get("max_position_embeddings") or 2**31 - 1)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params, lr=config.lr, betas=config.betas, eps=config.eps, weight_decay=config.weight_decay
        )
        self._reset()

    def _build_model(self, *, trainable: bool) -> PolicyLogprobs:
        from transformers import AutoModelForCausalLM

        try:
            # float32 master weights whatever config.dtype: bfloat16 is the compute dtype (autocast)
            hf = AutoModelForCausalLM.from_pretrained(self.config.model_dir, dtype=torch.float32)
        except (ValueError, OSError) as exc:
            raise ConfigError(f"cannot load a causal LM from {self.config.model_dir!r}: {exc}") from None
        model = PolicyLogprobs(hf, self.config.logits_chunk_tokens).to(self.device)
        model.train(trainable)
        model.requires_grad_(trainable)
        if self.dp_size > 1:
            _shard(model, self.device_type)
        return model

    # --- Trainer protocol (the rest is PolicyTrainer's) -----------------------------------

    def export_weights(self) -> dict[str, Any]:
        """HF-named full tensors (on CPU) of the current policy, on every rank (collective under
        FSDP), in config.dtype (the float32 master weights cast to bfloat16 under --dtype bfloat16).
        With tied embeddings the one shared matrix is exported as model.embed_tokens.weight."""
        dtype = getattr(torch, self.config.dtype)
        return {name.removeprefix(_PREFIX): full_cpu(p).to(dtype) for name, p in self.model.named_parameters()}

    def named_weights(self):
        """(HF name, full tensor on the trainer's device), one parameter at a time: under FSDP each
        is gathered when it is reached (collective: every rank iterates to the end), so no rank ever
        holds more than its shard plus one whole parameter.  Tied embeddings: one name, as export_weights.
        In config.dtype, as export_weights (the float32 master weights cast on the device)."""
        dtype = getattr(torch, self.config.dtype)
        for name, p in self.model.named_parameters():
            yield name.removeprefix(_PREFIX), full_tensor(p).to(dtype)

    def gradients(self) -> dict[str, Any]:
        """The accumulated (not yet normalised) gradients, HF-named full tensors on every rank (a
        tied matrix under its first name, as export_weights); for diagnostics and tests."""
        named = self.model.named_parameters()
        return {name.removeprefix(_PREFIX): full_cpu(p.grad) for name, p in named if p.grad is not None}

    def _logprobs(self, model, packed):
        return model(packed.input_ids, packed.targets, packed.mask if self.config.response_logits_only else None)

    def _checkpoint_info(self) -> dict:
        return {"model_dir": self.config.model_dir, "world_size": self.dp_size}


def _shard(model: PolicyLogprobs, device_type: str) -> None:
    """FSDP2: each decoder layer its own unit, the rest (embedding, norm, LM head) in the root;
    gradients summed over ranks, not averaged."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    for layer in model.hf.get_decoder().layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
    if device_type == "cpu":
        force_sum_reduction(model)  # gloo has no PREMUL_SUM


def _check_logits_are_a_plain_head(model_dir: str, hf_config: dict) -> None:
    """PolicyLogprobs computes logits as hidden @ lm_head.weight.T; refuse models that do more."""
    extra = [k for k in ("final_logit_softcapping", "logit_scale", "logits_scaling") if hf_config.get(k)]
    if extra:
        raise ConfigError(f"{model_dir}/config.json sets {', '.join(extra)}: TorchTrainer supports models whose "
                          f"logits are the LM head's product alone (Llama, Qwen)")
