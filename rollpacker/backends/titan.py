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
The CPU/gloo workarounds are all in `titan_cpu` and applied only when the device is CPU.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from rollpacker.backends import titan_cpu
from rollpacker.backends.titan_config import TitanConfig
from rollpacker.backends.titan_loss import (
    InvalidMicroBatch,
    check_micro_batch,
    grpo_token_loss,
    pack,
    split_for_ranks,
    token_logprobs_and_entropy,
)
from rollpacker.backends.titan_model import apply_parallel_plan, expected_hf_shapes, model_spec_from_hf, read_hf_config, read_hf_weights
from rollpacker.core.errors import ConfigError, RollpackerError
from rollpacker.core.protocols import MicroBatch, TrainStats

__all__ = ["InvalidMicroBatch", "TitanConfig", "TitanTrainer"]

_STATE_FILE = "rollpacker_trainer.json"


def _init_process_group(device: str) -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        return
    backend = "gloo" if device == "cpu" else "nccl"
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend=backend)
    else:  # a world of one, no rendezvous needed
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)


class TitanTrainer:
    """Implements rollpacker.core.protocols.Trainer on TorchTitan."""

    def __init__(self, config: TitanConfig):
        self.config = config
        hf_cfg = read_hf_config(config.model_dir)  # fail on a bad directory before heavy imports
        self.device_type = config.device or _default_device()
        on_cpu = self.device_type == "cpu"
        titan_cpu.stub_missing_triton_kernels()
        if on_cpu:
            titan_cpu.force_cpu_device_type()

        import torch
        import torch.distributed as dist
        from torchtitan.config import ParallelismConfig
        from torchtitan.distributed import ParallelDims
        from torchtitan.distributed import utils as dist_utils
        from torchtitan.models.common.config_utils import get_attention_config

        _init_process_group(self.device_type)
        self.rank = dist.get_rank()
        if self.device_type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")
        torch.manual_seed(config.seed)

        self.parallelism = ParallelismConfig(
            data_parallel_shard_degree=config.dp_shard,
            tensor_parallel_degree=config.tp,
            enable_sequence_parallel=config.sequence_parallel,
            **({"spmd_backend": titan_cpu.CPU_SPMD_BACKEND} if on_cpu else {}),
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
            fuse_qkv=titan_cpu.CPU_FUSE_QKV if on_cpu else True,
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
        self.step = 0
        self._pending = _Accumulator()

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

        dtype = getattr(torch, self.config.dtype)
        default = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device("meta"):
                model = self.spec.model_config.build()
        finally:
            torch.set_default_dtype(default)
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
        titan_sd = self.adapter.from_hf({k: v.to(dtype) for k, v in hf_weights.items()})
        set_model_state_dict(model, titan_sd, options=StateDictOptions(full_state_dict=True, strict=True))
        if trainable:
            model.train()
        else:
            model.eval()
            model.requires_grad_(False)
        return model

    # --- Trainer protocol -----------------------------------------------------------------

    def forward_backward(self, batch: MicroBatch) -> TrainStats:
        """Accumulate the gradient of sum_i w_i sum_t loss_it over this rank's share of `batch`."""
        import torch

        check_micro_batch(batch, vocab_size=self.vocab_size, max_seq_len=self.max_seq_len)
        share = split_for_ranks(batch.samples, self.dp_size)[self.dp_rank]
        # A rank left without samples still runs the collectives with a zero-weighted stand-in.
        is_empty = not share
        samples = [batch.samples[i] for i in share] or [batch.samples[0]]
        packed = pack(samples, pad_multiple=self.pad_multiple, device=self.device)

        logp, entropy = self._logprobs(self.model, packed.input_ids, packed.targets)
        # Old policy: the rollout's log-probs, or else the current weights' (unchanged since the
        # last optimizer step, so the detached forward values are exactly the recompute).
        has_old = packed.has_old if self.config.use_rollout_logprobs else torch.zeros_like(packed.has_old)
        old = torch.where(has_old, packed.old_logprobs, logp.detach())
        ref = None
        if self.ref_model is not None:
            with torch.no_grad():
                ref, _ = self._logprobs(self.ref_model, packed.input_ids, packed.targets)
        clip_high = self.config.clip_eps_high if self.config.clip_eps_high is not None else self.config.clip_eps
        token_loss, clipped = grpo_token_loss(
            logp, old, packed.advantages,
            clip_low=self.config.clip_eps, clip_high=clip_high, ref_logp=ref, kl_coef=self.config.kl_coef,
        )
        weights = packed.weights * (0.0 if is_empty else 1.0)
        loss = (token_loss * weights).sum()
        loss.backward()

        mask = packed.mask & (not is_empty)
        local = torch.stack([
            loss.detach().double(),
            mask.sum().double(),
            (entropy.detach() * mask).sum().double(),
            (clipped & mask).sum().double(),
        ])
        totals = self._sum_over_dp(local).tolist()
        stats = TrainStats(
            loss_sum=totals[0],
            num_tokens=int(totals[1]),
            entropy_sum=totals[2],
            clip_fraction=totals[3] / max(totals[1], 1.0),
        )
        self._pending.add(stats, totals[3])
        return stats

    def optimizer_step(self, loss_normalizer: float) -> TrainStats:
        """Divide the accumulated gradients by `loss_normalizer`, clip, take one AdamW step."""
        from torchtitan.distributed import utils as dist_utils

        if not (isinstance(loss_normalizer, (int, float)) and math.isfinite(loss_normalizer) and loss_normalizer > 0):
            raise ConfigError(f"optimizer_step: loss_normalizer must be a finite number > 0, got {loss_normalizer!r}")
        if self._pending.num_batches == 0:
            raise RollpackerError("optimizer_step called with no forward_backward since the last step")
        params = [p for p in self.model.parameters() if p.grad is not None]
        for p in params:
            p.grad.div_(loss_normalizer)
        max_norm = self.config.max_grad_norm if self.config.max_grad_norm is not None else math.inf
        grad_norm = dist_utils.clip_grad_norm_(params, max_norm, foreach=True)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        stats = self._pending.result(float(grad_norm))
        self._pending = _Accumulator()
        return stats

    def export_weights(self) -> dict[str, Any]:
        """HF-named full tensors (on CPU) of the current policy, on every rank.  With tied
        embeddings the one shared matrix is exported as model.embed_tokens.weight."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        sd = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True))
        return {k: v.detach().cpu().clone() for k, v in self.adapter.to_hf(sd).items()}

    def save(self, path: str | os.PathLike) -> None:
        """A resumable checkpoint (sharded model + optimizer state via torch.distributed.checkpoint,
        plus the step).  Collective: every rank calls it with the same path."""
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        if self._pending.num_batches:
            raise RollpackerError("save() between forward_backward and optimizer_step would lose the accumulated gradients")
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=os.fspath(path))
        if self.rank == 0:
            state = {"step": self.step, "model_dir": self.config.model_dir, "dp_shard": self.parallel_dims.dp_shard, "tp": self.config.tp}
            (Path(path) / _STATE_FILE).write_text(json.dumps(state, indent=1))
        dist.barrier()

    def load(self, path: str | os.PathLike) -> None:
        """Restore a checkpoint written by `save` (any rank layout: DCP reshards on load)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        state_file = Path(path) / _STATE_FILE
        if not state_file.is_file():
            raise ConfigError(f"{state_file} is missing: {path} is not a checkpoint written by TitanTrainer.save")
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=os.fspath(path))
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        self.step = int(json.loads(state_file.read_text())["step"])
        self._pending = _Accumulator()

    def gradients(self) -> dict[str, Any]:
        """The accumulated (not yet normalised) gradients as HF-named full tensors on every rank;
        for diagnostics and tests.  Collective."""
        from torch.distributed.tensor import DTensor

        grads = {}
        for name, p in self.model.named_parameters(remove_duplicate=False):  # both names of a tied matrix
            if p.grad is not None:
                g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                grads[name] = g.detach().cpu().clone()
        return self.adapter.to_hf(grads)

    def discard_gradients(self) -> None:
        """Drop the accumulated gradients and statistics without stepping (an abandoned step)."""
        self.optimizer.zero_grad(set_to_none=True)
        self._pending = _Accumulator()

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

    # --- internals ------------------------------------------------------------------------

    def _logprobs(self, model, input_ids, targets):
        from torch.distributed.tensor import DTensor

        logits = model(input_ids, attention_masks=self._attention_masks(model, input_ids))
        if isinstance(logits, DTensor):  # TP: vocab-sharded logits; the loss needs whole rows
            logits = logits.full_tensor()
        return token_logprobs_and_entropy(logits, targets)

    def _attention_masks(self, model, input_ids):
        if self.device_type == "cpu":
            return None  # SDPA, causal: right padding never leaks into real tokens
        import torch

        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        return model.get_attention_masks(positions)

    def _sum_over_dp(self, t):
        import torch.distributed as dist

        if self.dp_size == 1:
            return t
        group = self.parallel_dims.get_mesh("fsdp").get_group()
        t = t.to(self.device)
        dist.all_reduce(t, group=group)
        return t.cpu()


class _Accumulator:
    """Sums of the TrainStats of the micro-batches since the last optimizer step."""

    def __init__(self) -> None:
        self.num_batches = 0
        self.loss_sum = 0.0
        self.num_tokens = 0
        self.entropy_sum = 0.0
        self.num_clipped = 0.0

    def add(self, stats: TrainStats, num_clipped: float) -> None:
        self.num_batches += 1
        self.loss_sum += stats.loss_sum
        self.num_tokens += stats.num_tokens
        self.entropy_sum += stats.entropy_sum
        self.num_clipped += num_clipped

    def result(self, grad_norm: float) -> TrainStats:
        return TrainStats(
            loss_sum=self.loss_sum,
            num_tokens=self.num_tokens,
            entropy_sum=self.entropy_sum,
            clip_fraction=self.num_clipped / max(self.num_tokens, 1),
            grad_norm=grad_norm,
        )


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
