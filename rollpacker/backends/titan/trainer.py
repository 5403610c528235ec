"""The TorchTitan trainer backend: GRPO policy training with FSDP2 and/or tensor parallelism.

Run one `TitanTrainer` per rank under torchrun (world size and rank come from its environment;
without torchrun it is a world of one).  Every rank receives the same micro-batches and commands;
each data-parallel rank takes a token-balanced share of every micro-batch, and ranks of one
tensor-parallel group take the same share.

    trainer = TitanTrainer(TitanConfig(model_dir="ckpt/", dp_shard=2, tp=1, lr=1e-6))
    for mb in micro_batches:                    # streamed: one at a time, as groups complete
        trainer.forward_backward(mb)            # accumulates d/dtheta sum_i w_i sum_t loss_it
    trainer.optimizer_step(loss_normalizer)     # grads /= normaliser, clip, one AdamW step
    engine.update_weights(trainer.export_weights(), version)   # HF names, full tensors

Gradients are summed, never averaged, across data-parallel ranks (FSDP's division is turned off),
so the result is independent of the number of ranks and of how the batch was streamed.
The CPU/gloo workarounds are all in `titan.cpu` and applied only when the device is CPU.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from rollpacker.backends.titan import compat as titan_compat
from rollpacker.backends.titan import cpu as titan_cpu
from rollpacker.backends.errors import InvalidMicroBatch
from rollpacker.backends.trainer.loss import at_positions, response_positions, token_logprobs_and_entropy
from rollpacker.backends.trainer.policy import (PolicyTrainer, default_device, full_cpu, full_tensor,
                                                init_process_group, select_device)
from rollpacker.backends.titan.config import TitanConfig
from rollpacker.backends.titan.model import apply_parallel_plan, expected_hf_shapes, model_spec_from_hf, read_hf_config, read_hf_weights
from rollpacker.core.errors import ConfigError

__all__ = ["InvalidMicroBatch", "TitanConfig", "TitanTrainer", "titan_import_error"]

# What TitanTrainer imports from TorchTitan.  With torch < 2.13 the model packages import only after
# titan_compat's stand-in ("cannot import name 'DataParallelMeshDims' from 'torch.distributed.fsdp').
_TITAN_MODULES = ("torchtitan.config", "torchtitan.distributed", "torchtitan.models.llama3", "torchtitan.models.qwen3")


def titan_import_error() -> str | None:
    """None when TorchTitan imports here; else one line naming the installed torch and the way out
    (the plain PyTorch trainer).  Imports TorchTitan, so call it only when it will be used."""
    import importlib

    import torch

    titan_compat.prepare_import()
    try:
        for name in _TITAN_MODULES:
            importlib.import_module(name)
    except ImportError as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        reason = reason.replace(f" ({exc.path})", "") if exc.path else reason  # the module's file: noise
        return (f"the TorchTitan trainer cannot run with the installed torch {torch.__version__} ({reason}); "
                f"torchtitan 0.3.0 needs torch>=2.11: install it, or pass --trainer torch (the plain PyTorch trainer)")
    return None


class TitanTrainer(PolicyTrainer):
    """Implements rollpacker.core.protocols.Trainer on TorchTitan (the step logic is PolicyTrainer's)."""

    def __init__(self, config: TitanConfig):
        self.config = config
        hf_cfg = read_hf_config(config.model_dir)  # fail on a bad directory before heavy imports
        self.device_type = config.device or default_device()
        on_cpu = self.device_type == "cpu"
        titan_compat.prepare_import()  # the triton stand-in; torch < 2.13's stand-in
        if on_cpu:
            titan_cpu.force_cpu_device_type()

        import torch
        import torch.distributed as dist
        from torchtitan.config import ParallelismConfig
        from torchtitan.distributed import ParallelDims
        from torchtitan.distributed import utils as dist_utils
        from torchtitan.models.common.config_utils import get_attention_config

        init_process_group(self.device_type)
        self.rank = dist.get_rank()
        self.device = select_device(self.device_type)
        torch.manual_seed(config.seed)

        # partial_dtensor on CPU (titan.cpu 4) and with torch < 2.13 on any device (titan.compat);
        # elsewhere TorchTitan's default.
        backend = titan_cpu.CPU_SPMD_BACKEND if on_cpu else titan_compat.spmd_backend()
        self.parallelism = ParallelismConfig(
            data_parallel_shard_degree=config.dp_shard,
            tensor_parallel_degree=config.tp,
            enable_sequence_parallel=config.sequence_parallel,
            **({"spmd_backend": backend} if backend else {}),
        )
        spmd_backend = self.parallelism.spmd_backend
        world = dist.get_world_size()
        try:
            self.parallel_dims = ParallelDims.from_config(self.parallelism, world)
        except AssertionError as exc:
            raise ConfigError(f"TitanConfig dp_shard={config.dp_shard} tp={config.tp} vs world size {world}: {exc}") from None
        dist_utils.set_spmd_backend(spmd_backend)

        self.spec = model_spec_from_hf(
            hf_cfg,
            inner_attention=titan_cpu.cpu_inner_attention() if on_cpu else get_attention_config("flex"),
            # unfused under partial_dtensor, on any device: a fused QKV fails to load its full state dict
            fuse_qkv=titan_cpu.CPU_FUSE_QKV if backend else True,
            max_seq_len=config.max_seq_len,
            config_file=str(Path(config.model_dir) / "config.json"),
        )
        apply_parallel_plan(
            self.spec, tp=config.tp, sequence_parallel=config.sequence_parallel,
            config_file=str(Path(config.model_dir) / "config.json"),
        )
        self.max_seq_len = self.spec.model_config.max_seq_len
        self.vocab_size = self.spec.model_config.vocab_size
        self.adapter = self.spec.adapter_cls(self.spec.model_config, None)

        self.model = self._build_model(trainable=True)
        self.ref_model = self._build_model(trainable=False) if config.kl_coef > 0 else None
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params, lr=config.lr, betas=config.betas, eps=config.eps, weight_decay=config.weight_decay
        )
        self._reset()

        dp_size = self.parallel_dims.dp_shard * self.parallel_dims.dp_replicate
        self.dp_size = dp_size
        self.dp_rank = self.parallel_dims.get_mesh("fsdp").get_local_rank() if dp_size > 1 else 0
        self.pad_multiple = config.tp if (config.tp > 1 and config.sequence_parallel) else 1

    # --- building -------------------------------------------------------------------------

    def _build_model(self, *, trainable: bool):
        """Meta-device build -> shape check against the files -> parallelize -> load weights."""
        import torch
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        from torchtitan.config import CompileConfig, TrainingConfig
        from torchtitan.distributed.fsdp import disable_fsdp_gradient_division

        with torch.device("meta"):  # float32 master weights; bfloat16 is the compute dtype (FSDP2's
            model = self.spec.model_config.build()  # param_dtype when sharded, autocast in _logprobs)
        hf_weights = read_hf_weights(self.config.model_dir, expected_hf_shapes(self.adapter, model))

        model = self.spec.parallelize_fn(
            model,
            parallel_dims=self.parallel_dims,
            training=TrainingConfig(mixed_precision_param=self.config.dtype),
            parallelism=self.parallelism,
            compile_config=CompileConfig(enable=False),
            ac_config=None,
            dump_folder="",
        )
        if self.device_type == "cpu":
            titan_cpu.force_sum_reduction(model)
        disable_fsdp_gradient_division(model)  # sum over ranks: the loss contract is a sum
        model.to_empty(device=self.device)
        with torch.no_grad():
            model.init_weights(buffer_device=None)
        titan_sd = self.adapter.from_hf({k: v.to(torch.float32) for k, v in hf_weights.items()})
        set_model_state_dict(model, titan_sd, options=StateDictOptions(full_state_dict=True, strict=True))
        if trainable:
            model.train()
        else:
            model.eval()
            model.requires_grad_(False)
        return model

    def export_weights(self) -> dict[str, Any]:
        """HF-named full tensors (on CPU) of the current policy, on every rank.  With tied
        embeddings the one shared matrix is exported as model.embed_tokens.weight.  In config.dtype:
        the float32 master weights cast to bfloat16 under --dtype bfloat16."""
        import torch
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        sd = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True))
        dtype = getattr(torch, self.config.dtype)
        return {k: v.detach().cpu().to(dtype, copy=True) for k, v in self.adapter.to_hf(sd).items()}

    def named_weights(self):
        """(HF name, full tensor on the trainer's device), one parameter at a time (each gathered
        when reached: collective, every rank iterates to the end); never the whole model at once.
        In config.dtype, as export_weights (the float32 master weights cast on the device)."""
        import torch

        dtype = getattr(torch, self.config.dtype)
        for name, tensor in self.model.state_dict().items():
            yield from self.adapter.to_hf({name: full_tensor(tensor).to(dtype)}).items()

    def gradients(self) -> dict[str, Any]:
        """The accumulated (not yet normalised) gradients as HF-named full tensors on every rank;
        for diagnostics and tests.  Collective."""
        named = self.model.named_parameters(remove_duplicate=False)  # both names of a tied matrix
        return self.adapter.to_hf({name: full_cpu(p.grad) for name, p in named if p.grad is not None})

    # --- internals ------------------------------------------------------------------------

    def _logprobs(self, model, packed):
        from torch.distributed.tensor import DTensor

        masks = self._attention_masks(model, packed.input_ids)
        if self.config.tp > 1 or not self.config.response_logits_only:  # TP: the head's input is a DTensor
            logits = model(packed.input_ids, attention_masks=masks)
            if isinstance(logits, DTensor):  # TP: vocab-sharded logits; the loss needs whole rows
                logits = logits.full_tensor()
            return token_logprobs_and_entropy(logits, packed.targets)
        index = response_positions(packed.mask)
        with _head_rows(model.lm_head, index):  # [response positions, vocab] logits, not [B, L, vocab]
            logits = model(packed.input_ids, attention_masks=masks)
        logp, entropy = token_logprobs_and_entropy(logits, packed.targets.reshape(-1).index_select(0, index))
        return at_positions(logp, index, packed.targets.shape), at_positions(entropy, index, packed.targets.shape)

    def _attention_masks(self, model, input_ids):
        if self.device_type == "cpu":
            return None  # SDPA, causal: right padding never leaks into real tokens
        import torch

        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        return model.get_attention_masks(positions)

    def _dp_group(self):
        return self.parallel_dims.get_mesh("fsdp").get_group()

    def _checkpoint_info(self) -> dict:
        return {"model_dir": self.config.model_dir, "dp_shard": self.parallel_dims.dp_shard, "tp": self.config.tp}


@contextlib.contextmanager
def _head_rows(head, index):
    """While open, `head` (the model's LM head, called inside its forward) sees only the rows `index`
    of its [B, L, H] input, flattened: its output is [len(index), vocab].  The hook wraps the call
    inside the model's own forward, so FSDP2's gathers of the head happen as they always do."""
    def select(module, args):
        hidden = args[0]
        return (hidden.reshape(-1, hidden.shape[-1]).index_select(0, index), *args[1:])

    handle = head.register_forward_pre_hook(select)
    try:
        yield
    finally:
        handle.remove()
