"""Getting a trainer's weights into SGLang servers: through disk, or broadcast in buckets.

Disk (`write_safetensors_dir`): HF-named tensors written as one safetensors file, with the model's
config files copied beside them when given (real SGLang reloads a whole model directory; rollpacker
serve only reads the tensors).  The folder must be visible to every server.

Distributed (`DistributedWeightSync`), SGLang's /init_weights_update_group and
/update_weights_from_distributed (docs/advanced_features/sglang_for_rl.md):

Theory of operation
    One process group joins the trainer and every server's TP workers: the trainer is rank 0, server
    i holds ranks 1 + sum(tp of servers before i) ... + tp_i (its `rank_offset` plus its TP rank).
    Creating it is a rendezvous: the servers' /init_weights_update_group calls and the trainer's own
    `join_group` must run at the same time (`connect`, once, at the first push).  Then each bucket is
    one /update_weights_from_distributed {names, dtypes, shapes, group_name, flush_cache,
    weight_version} on every server (inside SGLang's weight-update session: /begin_weight_update
    before the first bucket, /end_weight_update after the last; 0.5.23 refuses a bucket outside one), while the trainer broadcasts those tensors from rank 0 in the
    announced order; each server receives them into new tensors and loads them.

    Buckets: `named_tensors` is consumed lazily (a trainer's `named_weights()` gathers one parameter
    at a time on its device), and a bucket is sent once the next tensor would push it past
    `bucket_bytes`, so the trainer holds at most one bucket plus one parameter beyond its own shard,
    and each server one bucket beyond its weights (never the whole model in one call).

    Only rank 0 of a torchrun trainer joins the group (SGLang's receivers broadcast from rank 0 of
    their group, and one sender suffices); the other trainer ranks take part in the gathers
    (`drain`) and go back to waiting for rank 0's next command.  If a bucket fails, rank 0 still runs
    the rest of the gathers before raising, so no rank is left inside a collective.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from attrs import frozen

from rollpacker.backends.errors import ServerRejected, ServerUnavailable

log = logging.getLogger(__name__)

_CONFIG_FILES = ("config.json", "generation_config.json")
DEFAULT_BUCKET_BYTES = 512 * 2**20


def write_safetensors_dir(weights: Mapping[str, Any], parent: str | os.PathLike | None = None,
                          config_dir: str | os.PathLike | None = None, prefix: str = "rollpacker-weights-") -> Path:
    """Write `weights` (name -> tensor) as `model.safetensors` in a new folder `prefix...` under
    `parent` (None: the system temp folder); copy the config files of `config_dir` beside it; return
    the folder."""
    import torch
    from safetensors.torch import save_file

    if parent is not None:
        Path(parent).mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    tensors = {name: torch.as_tensor(t).detach().to("cpu").contiguous() for name, t in weights.items()}
    save_file(tensors, str(folder / "model.safetensors"))
    if config_dir is not None:
        for name in _CONFIG_FILES:
            if (Path(config_dir) / name).is_file():
                shutil.copy(Path(config_dir) / name, folder / name)
    return folder



def dtype_name(tensor) -> str:
    """SGLang's dtype label of a tensor ("bfloat16", not "torch.bfloat16")."""
    return str(tensor.dtype).removeprefix("torch.")


def tensor_dtype(name: str):
    """The torch dtype of an SGLang dtype label; a ValueError naming it otherwise."""
    import torch

    dtype = getattr(torch, name.removeprefix("torch."), None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def buckets(named_tensors: Iterable[tuple[str, Any]], bucket_bytes: int) -> Iterator[list[tuple[str, Any]]]:
    """Consecutive groups of (name, tensor) of at most `bucket_bytes` each (a larger tensor alone),
    taken lazily: a tensor is read only when the bucket before it is full or sent."""
    bucket: list[tuple[str, Any]] = []
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def join_group(master_address: str, master_port: int, rank: int, world_size: int, group_name: str,
               backend: str, timeout_s: float):
    """Join a process group outside the default one, as SGLang's workers build theirs for weight
    updates (a TCP store served by rank 0 at the master address, prefixed with the group's name);
    both the trainer (rank 0) and `rollpacker serve` use it.  The store is made directly, not by
    `dist.rendezvous("tcp://...")`: under torchrun that would look for the elastic agent's store
    instead of serving one, and every member would wait for a server that never starts."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _new_process_group_helper, _world

    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(master_address, master_port, world_size, rank == 0, timeout=timeout, multi_tenant=True)
    store = dist.PrefixStore(group_name, store)
    group = _new_process_group_helper(world_size, rank, [], backend, store, group_name=group_name, timeout=timeout)
    group = group[0] if isinstance(group, tuple) else group
    _world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    return group


def local_address(url: str) -> str:
    """This machine's address as the server at `url` reaches it (the interface that routes there)."""
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname or "127.0.0.1"
    if host in ("127.0.0.1", "localhost", "::1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))  # UDP: nothing is sent, the kernel only picks the route
        return probe.getsockname()[0]


@frozen
class SyncStats:
    """One push: tensors and bytes broadcast (per receiving rank), buckets, seconds."""

    num_tensors: int
    num_bytes: int
    num_buckets: int
    seconds: float

    @property
    def s_per_gb(self) -> float:
        return self.seconds / max(self.num_bytes / 1e9, 1e-12)


def in_daemon_thread(fn, *args) -> concurrent.futures.Future:
    """`fn(*args)` on a daemon thread (one a refusal left hanging never holds up the process's exit)."""
    future: concurrent.futures.Future = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001  (handed to whoever waits on the future)
            future.set_exception(exc)

    threading.Thread(target=run, name="rollpacker-join", daemon=True).start()
    return future


def unique_group_name() -> str:
    """A weight-sync group name of its own per trainer start: a restarted trainer must not ask the
    servers to join a name they still hold from the last one (SGLang keeps a group until destroyed)."""
    return f"rollpacker-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def drain(named_tensors: Iterable[tuple[str, Any]]) -> None:
    """Run a trainer's gathers to the end, keeping nothing (the ranks that do not send)."""
    for _ in named_tensors:
        pass


class DistributedWeightSync:
    """The trainer side of SGLang's distributed weight path, over an `SGLangEngine`'s servers.

        sync = DistributedWeightSync(engine, master_address="10.0.0.5", master_port=29600)
        stats = sync.push(trainer.named_weights(), version)   # connects at the first push

    `tp_sizes`: each live server's TP size (None: its /get_server_info `tp_size`, else 1).  `backend`:
    "nccl" (tensors on CUDA) or "gloo" (CPU tensors; rollpacker serve only).  `dtype`: cast every
    tensor to it before sending (the servers' dtype, e.g. bf16 from fp32 master weights; None: as is).
    """

    def __init__(self, engine, *, master_address: str, master_port: int, tp_sizes: Sequence[int] | None = None,
                 group_name: str | None = None, backend: str = "nccl",
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, dtype: Any = None, timeout_s: float = 600.0):
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
        self.engine = engine
        self.master_address = master_address
        self.master_port = master_port
        self.tp_sizes = None if tp_sizes is None else list(tp_sizes)
        self.group_name = group_name or unique_group_name()
        self.backend = backend
        self.bucket_bytes = bucket_bytes
        self.dtype = dtype
        self.timeout_s = timeout_s
        self.group = None
        self.urls: list[str] = []
        """The servers that joined the group; a push goes to exactly these."""

    def connect(self) -> None:
        """Every live server joins the group (rank offsets by TP size) while the trainer joins as rank 0."""
        self.urls = self.engine.live_urls()
        tp_sizes = self.tp_sizes or self._server_tp_sizes()
        if len(tp_sizes) != len(self.urls):
            raise ValueError(f"tp_sizes has {len(tp_sizes)} entries for {len(self.urls)} servers")
        offsets, rank = {}, 1
        for url, tp in zip(self.urls, tp_sizes):
            offsets[url] = rank
            rank += tp
        world_size = rank
        pending = self.engine.call_servers(lambda c: c.init_weights_update_group(
            self.master_address, self.master_port, offsets[c.url], world_size, self.group_name, self.backend))
        joined = in_daemon_thread(join_group, self.master_address, self.master_port, 0, world_size,
                                  self.group_name, self.backend, self.timeout_s)
        concurrent.futures.wait([pending, joined], self.timeout_s, return_when=concurrent.futures.FIRST_EXCEPTION)
        if pending.done() and pending.exception() is not None:
            # A server refused: our side would wait out the whole timeout for it.  Stop now.
            raise ServerRejected(f"a server refused to join the weight-sync group {self.group_name!r}: "
                                 f"{pending.exception()}; restart that server, or use --weight-sync disk:DIR"
                                 ) from pending.exception()
        self.group = joined.result(self.timeout_s)
        pending.result(self.timeout_s)

    def close(self) -> None:
        """Leave the group on both sides (the servers' /destroy_weights_update_group, best effort and
        bounded), so that a later trainer start joins a fresh group instead of an orphan."""
        if self.group is None:
            return
        import torch.distributed as dist

        group, self.group = self.group, None
        try:
            self.engine.call_servers(lambda c: c.destroy_weights_update_group(self.group_name)).result(30)
        except Exception as exc:  # noqa: BLE001  (a server that cannot drop it keeps an idle group)
            log.warning("weight-sync group %r not destroyed on every server: %s", self.group_name, exc)
        dist.destroy_process_group(group)

    def _server_tp_sizes(self) -> list[int]:
        infos = self.engine.call_servers(lambda c: c.server_info()).result(self.timeout_s)
        return [int(info.get("tp_size") or 1) for info in infos]

    def push(self, named_tensors: Iterable[tuple[str, Any]], version: int) -> SyncStats:
        """Send every tensor, bucket by bucket; the caller pauses generation around it."""
        iterator = iter(named_tensors)
        started = time.monotonic()
        num_tensors = num_bytes = num_buckets = 0
        try:
            if self.group is None:
                self.connect()
            if self.engine.live_urls() != self.urls:
                raise ServerUnavailable(f"the servers changed since the weight group was made: {self.urls} -> "
                                        f"{self.engine.live_urls()}; restart the run (a group cannot lose a rank)")
            with self._session():
                for bucket in buckets(self._prepared(iterator), self.bucket_bytes):
                    self._send(bucket, version)
                    num_buckets += 1
                    num_tensors += len(bucket)
                    num_bytes += sum(t.numel() * t.element_size() for _, t in bucket)
        finally:
            drain(iterator)  # after a failure: the other trainer ranks are still in these gathers
        return SyncStats(num_tensors, num_bytes, num_buckets, time.monotonic() - started)

    @contextlib.contextmanager
    def _session(self):
        """The servers' weight-update session around the buckets (/begin_weight_update, then
        /end_weight_update even after a failed bucket)."""
        self.engine.call_servers(lambda c: c.weight_update_session("begin")).result(self.timeout_s)
        try:
            yield
        finally:
            self.engine.call_servers(lambda c: c.weight_update_session("end")).result(self.timeout_s)

    def _prepared(self, named_tensors: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
        for name, tensor in named_tensors:
            tensor = tensor.detach()
            if self.dtype is not None:
                tensor = tensor.to(self.dtype)
            yield name, tensor.contiguous()

    def _send(self, bucket: list[tuple[str, Any]], version: int) -> None:
        """One /update_weights_from_distributed on every server while rank 0 broadcasts the bucket."""
        import torch.distributed as dist

        names = [name for name, _ in bucket]
        dtypes = [dtype_name(t) for _, t in bucket]
        shapes = [list(t.shape) for _, t in bucket]
        pending = self.engine.call_servers(lambda c: c.update_weights_from_distributed(
            names, dtypes, shapes, self.group_name, version))
        try:
            for _, tensor in bucket:
                dist.broadcast(tensor, src=0, group=self.group)
        finally:
            pending.result(self.timeout_s)


def receive_bucket(group, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]],
                   device: Any = "cpu") -> dict[str, Any]:
    """The receiving side of one bucket: a new tensor per (name, dtype, shape), filled by rank 0's
    broadcasts in that order."""
    import torch
    import torch.distributed as dist

    received = {}
    for name, dtype, shape in zip(names, dtypes, shapes):
        tensor = torch.empty(tuple(shape), dtype=tensor_dtype(dtype), device=device)
        dist.broadcast(tensor, src=0, group=group)
        received[name] = tensor
    return received
