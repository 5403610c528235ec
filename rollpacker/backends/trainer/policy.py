"""What the two GRPO trainers (TorchTitan's `TitanTrainer`, plain PyTorch's `TorchTrainer`) share:
the Trainer Protocol's step logic, written once over three hooks.

    forward_backward(batch)      check -> forwards of <= max_forward_tokens padded tokens ->
                                 each: this rank's token-balanced share -> pack -> log-probs (hook
                                 `_logprobs`, under bf16 autocast when dtype says so) -> GRPO loss
                                 -> backward; stats summed over forwards and ranks
    optimizer_step(normalizer)   grads /= normalizer, clip the global norm, one AdamW step
    save(path) / load(path)      model + optimizer (torch.distributed.checkpoint, any rank layout)
                                 and the step, written beside `path` and renamed into place

A subclass sets `config` (a TrainerConfig), `model`, `ref_model` (None without KL), `optimizer`,
`device`, `rank`, `vocab_size`, `max_seq_len`, `dp_size`, `dp_rank`, `pad_multiple`, then calls
`_reset()`; it implements `_logprobs(model, packed)` and may override `_dp_group()` (default: the
world) and `_checkpoint_info()` (what the state file records besides the step).

Invariant: gradients are sums over tokens, samples, micro-batches and ranks (never means), so the
streamed micro-batches of a step sum to exactly its full-batch gradient on any number of ranks.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

from rollpacker.backends.trainer.loss import (check_micro_batch, grpo_token_loss, pack, padded_chunks, padded_width,
                                              split_for_ranks)
from rollpacker.core.errors import ConfigError, RollpackerError
from rollpacker.core.protocols import MicroBatch, TrainStats

STATE_FILE = "rollpacker_trainer.json"


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def init_process_group(device: str, *, world_of_one: bool = True) -> None:
    """gloo on CPU, nccl on CUDA; torchrun's rendezvous when WORLD_SIZE is set, else (if
    `world_of_one`) a process group of one with no rendezvous."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    backend = "gloo" if device == "cpu" else "nccl"
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend=backend)
    elif world_of_one:
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)


def select_device(device: str | None):
    """The torch.device to train on: this rank's GPU under torchrun, else the CPU."""
    import torch

    if (device or default_device()) == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def clip_grad_norm(params: list, max_norm: float | None):
    """Scale the gradients to a global norm of at most `max_norm` (None: no clipping); return the
    norm before clipping.  Sharded (DTensor) gradients give a partial norm, reduced here."""
    import torch
    from torch.distributed.tensor import DTensor

    total = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    if max_norm is not None:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total, foreach=True)
    return total


def full_tensor(t):
    """`t` detached, gathered whole on its own device when it is a sharded DTensor (collective then)."""
    from torch.distributed.tensor import DTensor

    return (t.full_tensor() if isinstance(t, DTensor) else t).detach()


def force_sum_reduction(model) -> None:
    """Plain SUM collectives in every FSDP2 module of `model`: gloo lacks PREMUL_SUM, which FSDP2
    uses to scale gradients (we never divide gradients in the collective: the loss contract sums
    over ranks)."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)


def full_cpu(t):
    """A detached CPU copy of `t`, gathered whole when it is a sharded DTensor (collective then)."""
    return full_tensor(t).cpu().clone()


def give_back_freed_memory() -> None:
    """Return the C allocator's free pages to the system (glibc's malloc_trim, every arena; nothing
    elsewhere).  glibc keeps freed blocks below its (growing) mmap threshold in its heaps, so on the
    CPU a forward's activations and logits, or a checkpoint read once, stayed resident after they were
    freed: measured at SmolLM2-135M, 1.3 GiB after one forward+backward and 0.5 GiB after building the
    trainer, on top of what the memory plan counts."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


@contextlib.contextmanager
def _quiet_single_process_dcp():
    """torch.distributed.checkpoint warns on every call without a process group (a world of one
    without torchrun, as TorchTrainer runs); that is the intended use here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


class PolicyTrainer:
    """Implements rollpacker.core.protocols.Trainer over a subclass's model and `_logprobs`."""

    def _reset(self) -> None:
        self.step = 0
        self._pending = _Accumulator()

    # --- hooks ----------------------------------------------------------------------------

    def _logprobs(self, model, packed) -> tuple[Any, Any]:
        """(log p(target), entropy), each [B, L] float32, of `model` on a PackedBatch."""
        raise NotImplementedError

    def _dp_group(self):
        return None

    def _checkpoint_info(self) -> dict:
        return {"model_dir": self.config.model_dir}

    # --- Trainer protocol -----------------------------------------------------------------

    def forward_backward(self, batch: MicroBatch) -> TrainStats:
        """Accumulate the gradient of sum_i w_i sum_t loss_it over this rank's share of `batch`, in
        forwards of at most `config.max_forward_tokens` padded tokens (`padded_chunks`)."""
        check_micro_batch(batch, vocab_size=self.vocab_size, max_seq_len=self.max_seq_len)
        chunks = padded_chunks(batch.samples, self.config.max_forward_tokens, pad_multiple=self.pad_multiple)
        local = sum(self._chunk_backward(chunk) for chunk in chunks)
        if self.device.type == "cpu":
            give_back_freed_memory()  # the forwards' activations and logits, freed
        totals = self._sum_over_dp(local).tolist()
        stats = TrainStats(loss_sum=totals[0], num_tokens=int(totals[1]), entropy_sum=totals[2],
                           clip_fraction=totals[3] / max(totals[1], 1.0), forwards=len(chunks),
                           padded_tokens=sum(len(c) * padded_width(c, self.pad_multiple) for c in chunks))
        self._pending.add(stats, totals[3])
        return stats

    def _chunk_backward(self, samples: list) -> Any:
        """Backward of this rank's share of `samples` in one padded forward; its [loss, tokens,
        entropy, clipped] sums (float64, on CPU)."""
        import torch

        share = split_for_ranks(samples, self.dp_size)[self.dp_rank]
        # A rank left without samples still runs the collectives with a zero-weighted stand-in.
        is_empty = not share
        packed = pack([samples[i] for i in share] or [samples[0]], pad_multiple=self.pad_multiple, device=self.device)

        with self._compute_dtype():
            logp, entropy = self._logprobs(self.model, packed)
        # Old policy: the rollout's log-probs, or else the current weights' (unchanged since the
        # last optimizer step, so the detached forward values are exactly the recompute).
        has_old = packed.has_old if self.config.use_rollout_logprobs else torch.zeros_like(packed.has_old)
        old = torch.where(has_old, packed.old_logprobs, logp.detach())
        ref = None
        if self.ref_model is not None:
            with torch.no_grad(), self._compute_dtype():
                ref, _ = self._logprobs(self.ref_model, packed)
        token_loss, clipped = grpo_token_loss(
            logp, old, packed.advantages,
            clip_low=self.config.clip_eps, clip_high=self.config.clip_high, ref_logp=ref, kl_coef=self.config.kl_coef,
        )
        loss = (token_loss * packed.weights * (0.0 if is_empty else 1.0)).sum()
        loss.backward()

        mask = packed.mask & (not is_empty)
        return torch.stack([loss.detach().double(), mask.sum().double(),
                            (entropy.detach() * mask).sum().double(), (clipped & mask).sum().double()]).cpu()

    def _compute_dtype(self):
        """bfloat16 compute over the float32 master weights (autocast) when config.dtype says so:
        parameters, gradients and AdamW's moments stay float32, so an update far below a bf16
        weight's resolution (lr 1e-5) still lands."""
        import torch

        if self.config.dtype == "float32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=getattr(torch, self.config.dtype))

    def optimizer_step(self, loss_normalizer: float) -> TrainStats:
        """Divide the accumulated gradients by `loss_normalizer`, clip, take one AdamW step."""
        if not (isinstance(loss_normalizer, (int, float)) and math.isfinite(loss_normalizer) and loss_normalizer > 0):
            raise ConfigError(f"optimizer_step: loss_normalizer must be a finite number > 0, got {loss_normalizer!r}")
        if self._pending.num_batches == 0:
            raise RollpackerError("optimizer_step called with no forward_backward since the last step")
        params = [p for p in self.model.parameters() if p.grad is not None]
        for p in params:
            p.grad.div_(loss_normalizer)
        grad_norm = clip_grad_norm(params, self.config.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        stats = self._pending.result(float(grad_norm))
        self._pending = _Accumulator()
        return stats

    def save(self, path: str | os.PathLike) -> None:
        """A resumable checkpoint (model + optimizer state via torch.distributed.checkpoint, plus
        the step).  Written to `<path>.saving` and renamed into place, so a kill mid-save leaves
        the previous checkpoint whole.  Collective: every rank calls it with the same path."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        if self._pending.num_batches:
            raise RollpackerError("save() between forward_backward and optimizer_step would lose the accumulated gradients")
        path = Path(path)
        tmp, old = path.with_name(path.name + ".saving"), path.with_name(path.name + ".previous")
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        _barrier()
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        with _quiet_single_process_dcp():
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=os.fspath(tmp))
        if self.device.type == "cpu":
            give_back_freed_memory()  # the save's buffers
        if self.rank == 0:
            state = {"trainer": type(self).__name__, "step": self.step, **self._checkpoint_info()}
            (tmp / STATE_FILE).write_text(json.dumps(state, indent=1))
            shutil.rmtree(old, ignore_errors=True)
            if path.exists():
                path.rename(old)
            tmp.rename(path)
            shutil.rmtree(old, ignore_errors=True)
        _barrier()

    def load(self, path: str | os.PathLike) -> None:
        """Restore a checkpoint written by `save` (any rank layout: DCP reshards on load)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        path = Path(path)
        if not (path / STATE_FILE).is_file() and (path.with_name(path.name + ".previous") / STATE_FILE).is_file():
            path = path.with_name(path.name + ".previous")  # killed between the two renames of save
        state_file = path / STATE_FILE
        if not state_file.is_file():
            raise ConfigError(f"{state_file} is missing: {path} is not a checkpoint written by {type(self).__name__}.save")
        saved = json.loads(state_file.read_text())
        if saved.get("trainer", "TitanTrainer") != type(self).__name__:
            raise ConfigError(f"{path} was written by {saved['trainer']}, not {type(self).__name__} (their "
                              f"parameter names differ); resume with the trainer that wrote it")
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        with _quiet_single_process_dcp():
            dcp.load(state, checkpoint_id=os.fspath(path))
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        self.step = int(saved["step"])
        self._pending = _Accumulator()

    def discard_gradients(self) -> None:
        """Drop the accumulated gradients and statistics without stepping (an abandoned step)."""
        self.optimizer.zero_grad(set_to_none=True)
        self._pending = _Accumulator()

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

    # --- internals ------------------------------------------------------------------------

    def _sum_over_dp(self, t):
        import torch.distributed as dist

        if self.dp_size == 1:
            return t
        t = t.to(self.device)
        dist.all_reduce(t, group=self._dp_group())
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
