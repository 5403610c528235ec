"""CPU / gloo workarounds for TorchTitan 0.3.0 -- the one place they live.

Theory of operation
-------------------
TorchTitan targets CUDA.  Run on CPU under torchrun with gloo (tests, laptops, CI), seven of its
defaults fail (checked with torch 2.13.0).  Every adjustment is here, and
the trainer calls these hooks only when the training device is CPU; on CUDA TorchTitan's own
defaults are used unchanged.

1. triton import:  ``torchtitan.models.common`` imports a Triton kernel module at import time,
   and CPU builds of torch ship no triton.  `stub_missing_triton_kernels` registers a stand-in
   module whose kernels raise if called (they serve expert-parallel MoE only).  Applied whenever
   triton is absent, because it must happen before the first torchtitan import.
2. device type:  ``torchtitan.tools.utils.device_type`` falls back to "cuda" when no accelerator
   exists, and the mesh builder reads it; `force_cpu_device_type` sets it to "cpu".
3. attention:  flex and varlen attention have no CPU backward; use SDPA (causal), which needs no
   mask because our batches are right-padded (a real token never attends to padding).
4. spmd backend:  the default ``spmd_types`` fails with torch 2.13; use ``partial_dtensor``.
5. unfused q/k/v:  a fused QKV projection breaks full-state-dict gathering (under partial_dtensor,
   on torch 2.11 and 2.13 alike: also used on CUDA with torch < 2.13, see `titan.compat`).
6. no torch.compile (also TorchTitan's default; the trainer never turns it on, on any device).
7. sum reduction:  gloo has no PREMUL_SUM, which FSDP2 uses to scale gradients;
   `force_sum_reduction` makes every FSDP module reduce with plain SUM.  (We never divide
   gradients in the collective anyway: the loss contract sums over ranks.)
"""

from __future__ import annotations

import importlib.util
import sys
import types

from rollpacker.backends.trainer.policy import force_sum_reduction  # workaround 7, shared with --trainer torch

__all__ = ["CPU_FUSE_QKV", "CPU_SPMD_BACKEND", "force_cpu_device_type", "force_sum_reduction",
           "stub_missing_triton_kernels", "cpu_inner_attention"]

CPU_SPMD_BACKEND = "partial_dtensor"
CPU_FUSE_QKV = False

_KERNELS_MODULE = "torchtitan.distributed.minimal_async_ep.kernels"


def stub_missing_triton_kernels() -> None:
    """Workaround 1: let torchtitan import without triton (a no-op when triton is installed)."""
    if importlib.util.find_spec("triton") is not None or _KERNELS_MODULE in sys.modules:
        return
    stub = types.ModuleType(_KERNELS_MODULE)
    stub.__doc__ = "rollpacker stand-in: triton is not installed; these kernels cannot run."

    def _missing(name: str):
        if name.startswith("__"):
            raise AttributeError(name)

        def kernel(*args, **kwargs):
            raise RuntimeError(f"{_KERNELS_MODULE}.{name} needs triton, which is not installed")

        return kernel

    stub.__getattr__ = _missing  # type: ignore[attr-defined]
    sys.modules[_KERNELS_MODULE] = stub


def force_cpu_device_type() -> None:
    """Workaround 2: make TorchTitan's mesh and helpers use the CPU device type."""
    import torchtitan.distributed.parallel_dims as parallel_dims
    import torchtitan.distributed.utils as dist_utils
    import torchtitan.tools.utils as tool_utils

    for module in (tool_utils, parallel_dims, dist_utils):
        module.device_type = "cpu"
    import torch

    tool_utils.device_module = torch.cpu
    dist_utils.device_module = torch.cpu
    import warnings

    # DTensor's RNG tracker is CUDA-only; our CPU meshes draw no random numbers through DTensor
    # (init comes from the HF weights), so its once-per-run warning says nothing to a user.
    warnings.filterwarnings("ignore", message="DTensor random operators may not have complete support on cpu")


def cpu_inner_attention():
    """Workaround 3: the inner-attention config to put in every layer."""
    from torchtitan.models.common.attention import ScaledDotProductAttention

    return ScaledDotProductAttention.Config()
