"""Weight updates of the embedded engine: HF-named tensors from a mapping or a safetensors
directory, checked against the model before anything is copied."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from rollpacker.core.errors import ConfigError


def load_state(weights: Mapping[str, Any] | str | os.PathLike) -> dict[str, Any]:
    """The mapping itself, or every tensor of the *.safetensors files in a directory."""
    if not isinstance(weights, (str, os.PathLike)):
        return dict(weights)
    from safetensors.torch import load_file

    path = Path(weights)
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else []
    if not files:
        raise ConfigError(f"update_weights: {str(path)!r} is not a directory holding *.safetensors files")
    state: dict[str, Any] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def check_state(model, state: Mapping[str, Any]) -> None:
    """Every name must be one of the model's, with the model's shape (a partial update is fine)."""
    own = model.state_dict()
    unknown = [k for k in state if k not in own]
    if unknown:
        raise ConfigError(f"update_weights: {len(unknown)} name(s) not in the model, e.g. {unknown[:3]}")
    for k, v in state.items():
        if tuple(v.shape) != tuple(own[k].shape):
            raise ConfigError(
                f"update_weights: shape of {k!r} is {tuple(v.shape)}, the model has {tuple(own[k].shape)}"
            )


@torch.inference_mode()
def apply_state(model, state: Mapping[str, Any]) -> None:
    """Copy `state` into the model's tensors in place (dtype and device converted)."""
    own = model.state_dict()
    for name, tensor in state.items():
        own[name].copy_(torch.as_tensor(tensor))
