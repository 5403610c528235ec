"""Getting a trainer's weights into SGLang servers: through disk, or broadcast over NCCL.

Disk (`write_safetensors_dir`): HF-named tensors written as one safetensors file, with the model's
config files copied beside them when given (real SGLang reloads a whole model directory; rollpacker
serve only reads the tensors).  The folder must be visible to every server.

NCCL (`DistributedWeightSync`), SGLang's /init_weights_update_group + /update_weights_from_distributed:
the trainer is rank 0 of a process group whose other ranks are the servers' TP workers (server i
holds ranks 1 + sum(tp of servers before i) ... + tp_i - 1).  Joining the group is a rendezvous:
the servers' /init_weights_update_group calls and the trainer's own group creation must run at
the same time, and so must each /update_weights_from_distributed call and the trainer's broadcast
of the same tensors in the same order.  Untested here (it needs GPUs and SGLang); the call sequence
follows SGLang's RL guide (docs/advanced_features/sglang_for_rl.md).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

_CONFIG_FILES = ("config.json", "generation_config.json")


def write_safetensors_dir(weights: Mapping[str, Any], parent: str | os.PathLike | None = None,
                          config_dir: str | os.PathLike | None = None) -> Path:
    """Write `weights` (name -> tensor) as `model.safetensors` in a new folder under `parent` (None:
    the system temp folder); copy the config files of `config_dir` beside it; return the folder."""
    import torch
    from safetensors.torch import save_file

    if parent is not None:
        Path(parent).mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="rollpacker-weights-", dir=parent))
    tensors = {name: torch.as_tensor(t).detach().to("cpu").contiguous() for name, t in weights.items()}
    save_file(tensors, str(folder / "model.safetensors"))
    if config_dir is not None:
        for name in _CONFIG_FILES:
            if (Path(config_dir) / name).is_file():
                shutil.copy(Path(config_dir) / name, folder / name)
    return folder


def _dtype_name(tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


class DistributedWeightSync:
    """The trainer side of SGLang's NCCL weight path, for an `SGLangEngine` (GPU only).

        sync = DistributedWeightSync(engine, master_address="10.0.0.5", master_port=29600, tp_sizes=[2, 2])
        sync.connect()                      # once
        sync.push(named_tensors, version)   # every step: pause -> broadcast -> continue
    """

    def __init__(self, engine, *, master_address: str, master_port: int, tp_sizes: Sequence[int],
                 group_name: str = "rollpacker_weight_sync", backend: str = "nccl", timeout_s: float = 600.0):
        if len(tp_sizes) != len(engine.live_urls()):
            raise ValueError(f"tp_sizes has {len(tp_sizes)} entries for {len(engine.live_urls())} servers")
        self.engine = engine
        self.master_address = master_address
        self.master_port = master_port
        self.tp_sizes = list(tp_sizes)
        self.group_name = group_name
        self.backend = backend
        self.timeout_s = timeout_s
        self.world_size = 1 + sum(self.tp_sizes)
        self.group = None

    def connect(self) -> None:
        """Every server joins the group (rank offsets by TP size) while the trainer joins as rank 0."""
        offsets = {}
        rank = 1
        for url, tp in zip(self.engine.live_urls(), self.tp_sizes):
            offsets[url] = rank
            rank += tp
        pending = self.engine.call_servers(lambda c: c.init_weights_update_group(
            self.master_address, self.master_port, offsets[c.url], self.world_size, self.group_name, self.backend))
        self.group = self._init_group()
        pending.result(self.timeout_s)

    def _init_group(self):
        """Rank 0 of a process group outside the default one, built as SGLang's workers build theirs
        (a TCP rendezvous, a prefix store named after the group)."""
        import torch.distributed as dist
        from torch.distributed.distributed_c10d import _new_process_group_helper, _world

        store, _, _ = next(dist.rendezvous(
            f"tcp://{self.master_address}:{self.master_port}", 0, self.world_size,
            timeout=timedelta(seconds=self.timeout_s)))
        store = dist.PrefixStore(self.group_name, store)
        group = _new_process_group_helper(self.world_size, 0, [], self.backend, store,
                                          group_name=self.group_name, timeout=timedelta(seconds=self.timeout_s))
        group = group[0] if isinstance(group, tuple) else group
        _world.pg_group_ranks[group] = {i: i for i in range(self.world_size)}
        return group

    def push(self, weights: Mapping[str, Any], version: int) -> None:
        """pause -> /update_weights_from_distributed on every server while rank 0 broadcasts each
        tensor in the announced order -> continue."""
        import torch.distributed as dist

        if self.group is None:
            raise RuntimeError("DistributedWeightSync.push before connect()")
        names = list(weights)
        dtypes = [_dtype_name(weights[n]) for n in names]
        shapes = [list(weights[n].shape) for n in names]
        self.engine.pause()
        try:
            pending = self.engine.call_servers(lambda c: c.update_weights_from_distributed(
                names, dtypes, shapes, self.group_name, version))
            for name in names:
                dist.broadcast(weights[name].contiguous(), src=0, group=self.group)
            pending.result(self.timeout_s)
            self.engine._version = int(version)
        finally:
            self.engine.resume()
