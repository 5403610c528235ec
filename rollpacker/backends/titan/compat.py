"""Older-torch workaround for TorchTitan 0.3.0 -- the one place it lives.

TorchTitan 0.3.0 is written against torch 2.13.  On torch 2.11 (the lent GPU machines have
2.11.0+cu130 and no network) one name that it imports at module level is missing:
``torch.distributed.fsdp.DataParallelMeshDims``, imported by ``torchtitan/distributed/fsdp.py``,
which every model package imports ("cannot import name 'DataParallelMeshDims' from
'torch.distributed.fsdp'").  TorchTitan builds one only under spmd_backend "full_dtensor" or
"spmd_types" (FSDP2 over a full SPMD mesh, torch 2.13's ``fully_shard(dp_mesh_dims=...)``); under
"partial_dtensor" it passes ``dp_mesh_dims=None`` and calls ``fully_shard`` as torch 2.11 has it.

`shim_missing_torch_names` registers a stand-in class that raises if it is ever built, and
`spmd_backend` then names "partial_dtensor" (the backend the CPU path uses on every torch), so the
stand-in is never built.  With torch >= 2.13 both are no-ops: TorchTitan's defaults are unchanged.
(The other names torch 2.11 lacks, ``torch._library.opaque_object.CustomClassBase`` and
``ShardPlacementResult``, are imported only by DeepEP and expert-parallel MoE code we never reach.)
"""

from __future__ import annotations

__all__ = ["OLD_TORCH_SPMD_BACKEND", "prepare_import", "shim_missing_torch_names", "spmd_backend"]

OLD_TORCH_SPMD_BACKEND = "partial_dtensor"

_shimmed = False


def shim_missing_torch_names() -> bool:
    """Register stand-ins for what TorchTitan 0.3.0 imports and this torch lacks; True when any was
    needed (torch < 2.13).  Must run before the first torchtitan import; idempotent."""
    global _shimmed
    import torch.distributed.fsdp as fsdp

    if _shimmed or hasattr(fsdp, "DataParallelMeshDims"):
        return _shimmed
    import torch

    version = torch.__version__

    class DataParallelMeshDims:  # noqa: D401 - a stand-in
        """rollpacker stand-in: this torch has no DataParallelMeshDims (torch >= 2.13)."""

        def __init__(self, *args, **kwargs):
            raise RuntimeError(
                f"torch {version} has no torch.distributed.fsdp.DataParallelMeshDims: TorchTitan's "
                f"spmd_backend 'full_dtensor'/'spmd_types' needs torch>=2.13; use '{OLD_TORCH_SPMD_BACKEND}'"
            )

    DataParallelMeshDims.__module__ = fsdp.__name__
    fsdp.DataParallelMeshDims = DataParallelMeshDims
    _shimmed = True
    return True


def _shim_create_block_mask() -> None:
    """torch < 2.13's create_block_mask has no `separate_full_blocks` (it always separates the full
    blocks, i.e. True, TorchTitan's value outside batch-invariant mode), which TorchTitan 0.3.0's
    flex-attention masks pass ("create_block_mask() got an unexpected keyword argument
    'separate_full_blocks'").  Drop it on the way in; refuse False, which this torch cannot do."""
    try:
        import torchtitan.models.common.attention as attention
    except ImportError:
        return  # no (or another) torchtitan: the caller's own import says so

    compiled = attention._compiled_create_block_mask
    if getattr(compiled, "_rollpacker_shim", False):
        return

    def create_block_mask(*args, separate_full_blocks: bool = True, **kwargs):
        if not separate_full_blocks:
            raise RuntimeError("create_block_mask(separate_full_blocks=False) (TorchTitan's batch-invariant "
                               "mode) needs torch>=2.13")
        return compiled(*args, **kwargs)

    create_block_mask._rollpacker_shim = True  # type: ignore[attr-defined]
    attention._compiled_create_block_mask = create_block_mask


def spmd_backend() -> str | None:
    """The spmd_backend the trainer must set on this torch: None (TorchTitan's default) unless the
    stand-in was needed.  Call after `shim_missing_torch_names` (`prepare_import`)."""
    return OLD_TORCH_SPMD_BACKEND if _shimmed else None


def prepare_import() -> None:
    """Everything that must happen before the first torchtitan import, on any device: the triton
    stand-in (CPU builds of torch) and the older-torch stand-in."""
    from rollpacker.backends.titan import cpu as titan_cpu

    titan_cpu.stub_missing_triton_kernels()
    if shim_missing_torch_names():
        _shim_create_block_mask()
