"""`SGLangEngine`: the rollout-engine Protocol over one or more SGLang servers' native HTTP API.

    engine = SGLangEngine(["http://10.0.0.1:30000", "http://10.0.0.2:30000"], expected_model="Qwen/...")
    engine.submit([GenerationRequest("rp000000000001", prompt_ids, max_new_tokens=512)])
    events = engine.poll(timeout=0.5)   # GenerationProgress / GenerationResult

Works against real SGLang (0.5.17+) and against `rollpacker serve` (the embedded engine behind the
same API), which is what CI tests it with.

Theory of operation
    An asyncio loop runs in a background thread and owns every connection and all request state;
    the Protocol's methods are synchronous and hand work to it (`call_soon_threadsafe`) or wait for
    a coroutine with a bound.  Three parts: this facade (validation, request ids, the event queue
    that `poll` reads), `pool.ServerPool` (the loop, the servers and their liveness, calls on every
    live server) and `inflight.InflightRequests` (one streamed /generate per request, on the loop:
    chunks become `GenerationProgress`, the final one the `GenerationResult`; aborts).

Failures
    - A stream that breaks, or stalls past `stall_timeout_s` while not paused, triggers a health
      check of its server.  A server that fails it is marked dead: the error (naming it) is logged and
      kept in `server_failures`, and every request it held comes back as a `GenerationResult` with
      finish_reason "abort" and the tokens received so far.  The core treats an abort it did not ask
      for as an engine failure and relaunches the sample, which goes to a live server: no prompt lost.
    - With no live server left, `submit` and `poll` raise `ServerUnavailable` naming every server.
    - A server that rejects a request (HTTP 4xx) or answers something malformed: the request comes
      back as an abort and the next `poll` raises `ServerRejected` / `BackendProtocolError` naming the
      server (relaunching would fail the same way).  All three are `rollpacker.backends.errors`'
      `BackendError`s; no aiohttp or JSON error reaches the caller raw.
    - Control calls are retried a bounded number of times; `poll(timeout)` never waits past timeout.

Weight updates: pause (mode "retract" by default) -> the new weights -> continue.  From disk
(`update_weights`): a mapping of tensors is first written as a safetensors directory (under
`weights_dir`, which must be visible to every server: a shared filesystem across nodes), then
/update_weights_from_disk on every server.  From a trainer (`update_weights_from_trainer`): after
`use_distributed_sync`, its `named_weights()` broadcast in buckets over SGLang's distributed path
(`weights.DistributedWeightSync`); otherwise written to disk as above.

Colocated mode: `release_memory(tags)` / `resume_memory(tags)` call SGLang's
/release_memory_occupation and /resume_memory_occupation {tags} on every live server.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import queue
import shutil
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rollpacker.backends.errors import BackendMisuse, SGLangError
from rollpacker.backends.requests import RequestIds
from rollpacker.backends.sglang.http import HttpConfig, ServerClient
from rollpacker.backends.sglang.inflight import InflightRequests
from rollpacker.backends.sglang.pool import ServerPool
from rollpacker.core.errors import ConfigError
from rollpacker.core.protocols import GenerationProgress, GenerationRequest, GenerationResult, check_memory_tags

log = logging.getLogger(__name__)


class SGLangEngine:
    """Rollout engine over SGLang(-compatible) servers at `urls`.

    expected_model: if set, each server's /get_model_info model_path must name it (same path or same
    final component), else construction fails naming the server.  capacity_per_server: running-batch
    limit per server (None: the server's max_running_requests if it reports one, else 64).
    pause_mode: SGLang's /pause_generation mode ("retract" keeps requests, recomputing their cache
    with the new weights; "in_place" keeps the cache; "abort" aborts them).  weights_dir: where
    `update_weights(mapping)` writes safetensors (None: a temporary folder, single node only), one
    folder per version, the older ones removed once every server loaded the newer.
    model_config_dir: a local copy of the model's config files to put beside those tensors (real
    SGLang reloads a whole model directory).
    """

    def __init__(
        self,
        urls: Sequence[str],
        *,
        expected_model: str | None = None,
        capacity_per_server: int | None = None,
        http: HttpConfig | None = None,
        pause_mode: str = "retract",
        stall_timeout_s: float = 30.0,
        start_timeout_s: float = 60.0,
        weights_dir: str | os.PathLike | None = None,
        model_config_dir: str | os.PathLike | None = None,
        weight_version: int = 0,
    ) -> None:
        urls = [urls] if isinstance(urls, str) else list(urls)
        if not urls:
            raise ConfigError("SGLangEngine needs at least one server URL")
        if len(set(urls)) != len(urls):
            raise ConfigError(f"server URLs must be distinct, got {urls}")
        if pause_mode not in ("retract", "in_place", "abort"):
            raise ConfigError(f"pause_mode must be retract, in_place or abort, got {pause_mode!r}")
        if capacity_per_server is not None and capacity_per_server < 1:
            raise ConfigError(f"capacity_per_server must be >= 1, got {capacity_per_server}")
        self.http = http or HttpConfig()
        self.pause_mode = pause_mode
        self.weights_dir = None if weights_dir is None else Path(weights_dir)
        self.model_config_dir = None if model_config_dir is None else Path(model_config_dir)
        self._version = weight_version
        self._distributed = None  # a weights.DistributedWeightSync after use_distributed_sync
        self._copies: list[str] = []  # folders written under weights_dir, the newest last
        self.last_sync = None
        """The last distributed sync's SyncStats (tensors, bytes, buckets, seconds)."""
        self._lock = threading.Lock()
        self._ids = RequestIds()  # guarded by _lock: in flight = submitted, result not yet queued
        self._out: queue.Queue = queue.Queue()
        self._held: list = []  # events taken from _out by a poll that raised instead (caller thread)
        self._is_paused = False
        self._is_closed = False
        self._pool = ServerPool(urls, self.http, expected_model=expected_model,
                                capacity_per_server=capacity_per_server, start_timeout_s=start_timeout_s)
        self._requests = InflightRequests(self._pool, emit=self._emit, version=lambda: self._version,
                                          is_paused=lambda: self._is_paused, stall_timeout_s=stall_timeout_s)

    # -- Protocol ---------------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return self._pool.capacity

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def urls(self) -> list[str]:
        return self._pool.urls

    def live_urls(self) -> list[str]:
        return self._pool.live_urls()

    @property
    def server_failures(self) -> list[SGLangError]:
        """Every server marked dead, with why (the message names it)."""
        return self._pool.failures

    def outstanding(self) -> dict[str, int]:
        """Requests in flight per server URL (a snapshot)."""
        return {s.url: len(s.outstanding) for s in self._pool.servers}

    def submit(self, requests: Sequence[GenerationRequest], *, server: str | None = None) -> None:
        """Queue `requests`, each to the live server with the fewest outstanding requests (or to the
        server whose URL is `server`).  Every request is validated before any is queued."""
        self._check_open()
        if server is not None and server.rstrip("/") not in self.urls:
            raise ConfigError(f"submit: unknown server {server!r}; servers are {self.urls}")
        self._pool.check_live()
        with self._lock:
            self._ids.check(requests)
            self._ids.add(requests)
        self._pool.loop.call_soon_threadsafe(self._requests.dispatch, list(requests), server)

    def poll(self, timeout: float | None = None) -> list[GenerationProgress | GenerationResult]:
        """Events since the last poll, waiting up to `timeout` for the first (None: until one
        arrives, or at once when nothing is in flight).  Raises a pending server error first."""
        self._raise_fatal()
        events: list = []
        if self._held:
            events, self._held = self._held, []
            timeout = 0.0
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while True:
            with self._lock:
                idle = not self._ids.live
            wait = 0.05 if idle else 0.2
            if deadline is not None:
                wait = min(wait, max(0.0, deadline - time.monotonic()))
            try:
                events.append(self._out.get(timeout=wait))
                break
            except queue.Empty:
                if self._pool.has_fatal():
                    break
                if (deadline is not None and time.monotonic() >= deadline) or (deadline is None and idle):
                    break
        while True:
            try:
                events.append(self._out.get_nowait())
            except queue.Empty:
                break
        if self._pool.has_fatal():  # raise first; these events come with the next poll
            self._held = events + self._held
            self._raise_fatal()
        events, self._held = self._held + events, []
        return events

    def abort(self, request_ids: Sequence[str]) -> None:
        """Abort these requests; each comes back from `poll` as a result (finish_reason "abort"
        with its partial tokens, or its normal finish if it ended first)."""
        self._check_open()
        with self._lock:
            self._ids.check_known(request_ids)
        self._pool.loop.call_soon_threadsafe(self._requests.abort, list(request_ids))

    def pause(self) -> None:
        self._check_open()
        self._is_paused = True
        self._pool.on_live_servers(lambda c: c.pause(self.pause_mode), "pausing")

    def resume(self) -> None:
        self._check_open()
        try:
            self._pool.on_live_servers(lambda c: c.resume(), "continuing")
        finally:
            self._is_paused = False

    def update_weights(self, weights: Mapping[str, Any] | str | os.PathLike, version: int) -> None:
        """pause -> /update_weights_from_disk on every live server -> continue (the pause and
        continue are skipped when the caller already paused).  A mapping is written first: to a
        temporary folder, removed after the update; or under `weights_dir`, where the newest folder
        stays (a restarted server may load it) and the older ones go once the servers hold it."""
        self._check_open()
        written = None
        if isinstance(weights, (str, os.PathLike)):
            path = str(weights)
        else:
            from rollpacker.backends.sglang.weights import write_safetensors_dir

            written = path = str(write_safetensors_dir(weights, self.weights_dir, self.model_config_dir,
                                                       prefix=f"rollpacker-weights-v{int(version)}-"))
            if self.weights_dir is not None:
                self._copies.append(written)
        try:
            with self._paused():
                self._pool.on_live_servers(lambda c: c.update_weights_from_disk(path, version), "updating weights",
                                           timeout=self.http.weights_timeout_s + 5)
                self._version = int(version)
            self._drop_copies_but(path)  # the servers hold `path` now
        finally:
            if written is not None and self.weights_dir is None:
                shutil.rmtree(written, ignore_errors=True)

    def _drop_copies_but(self, path: str) -> None:
        """Remove the folders this engine wrote under weights_dir, all but `path` (a failed update
        keeps them until the next one lands)."""
        for old in [c for c in self._copies if c != path]:
            shutil.rmtree(old, ignore_errors=True)
        self._copies = [c for c in self._copies if c == path]

    def release_memory(self, tags: Sequence[str] | None = None) -> None:
        """/release_memory_occupation {tags} on every live server (colocated mode: the trainer runs
        next on their GPUs); nothing may be in flight.  SGLang needs `--enable-memory-saver`."""
        tags = list(check_memory_tags(tags))
        self._check_open()
        with self._lock:
            if self._ids.live:
                raise BackendMisuse(f"release_memory: {len(self._ids)} request(s) still in flight")
        self._pool.on_live_servers(lambda c: c.release_memory_occupation(tags), "releasing memory",
                                   timeout=self.http.weights_timeout_s + 5)

    def resume_memory(self, tags: Sequence[str] | None = None) -> None:
        """/resume_memory_occupation {tags} on every live server (resumed weights: update them next)."""
        tags = list(check_memory_tags(tags))
        self._check_open()
        self._pool.on_live_servers(lambda c: c.resume_memory_occupation(tags), "resuming memory",
                                   timeout=self.http.weights_timeout_s + 5)

    def use_distributed_sync(self, *, backend: str, bucket_bytes: int, dtype: Any = None,
                             master_address: str | None = None, master_port: int | None = None,
                             group_name: str | None = None) -> None:
        """Send `update_weights_from_trainer`'s weights over SGLang's distributed path from now on
        (the group is made at the first sync and left at `close`; its name, by default, is new for each
        trainer start, so a restarted trainer never collides with a group the servers still hold).
        The master address defaults to this machine's address
        as the first server reaches it, the port to a free one there."""
        from rollpacker.backends.sglang.launch import free_port
        from rollpacker.backends.sglang.weights import DistributedWeightSync, local_address

        address = master_address or local_address(self.urls[0])
        self._distributed = DistributedWeightSync(
            self, master_address=address, master_port=master_port or free_port(address), backend=backend,
            bucket_bytes=bucket_bytes, dtype=dtype, group_name=group_name,
            timeout_s=self.http.weights_timeout_s)

    def update_weights_from_trainer(self, trainer, version: int):
        """The trainer's weights as policy `version`: broadcast in buckets after `use_distributed_sync`
        (returns its `SyncStats`), else gathered on this rank and loaded from disk (returns None).
        Reads `trainer.named_weights()` to its end either way (other trainer ranks gather with it)."""
        self._check_open()
        if self._distributed is None:
            return self.update_weights({name: t.cpu() for name, t in trainer.named_weights()}, version)
        with self._paused():
            stats = self._distributed.push(trainer.named_weights(), version)
            self._version = int(version)
        log.info("weights v%d: %d tensors, %.1f MB in %d buckets, %.2f s (%.2f s/GB)", version, stats.num_tensors,
                 stats.num_bytes / 1e6, stats.num_buckets, stats.seconds, stats.s_per_gb)
        self.last_sync = stats
        return stats

    @contextlib.contextmanager
    def _paused(self):
        """Generation paused around the block, unless the caller paused already."""
        was_paused = self._is_paused
        if not was_paused:
            self.pause()
        try:
            yield
        finally:
            if not was_paused:
                self.resume()

    def flush_cache(self) -> None:
        """/flush_cache on every live server; only when nothing is in flight (SGLang refuses then)."""
        self._check_open()
        with self._lock:
            if self._ids.live:
                raise BackendMisuse(f"flush_cache: {len(self._ids)} request(s) still in flight")
        self._pool.on_live_servers(lambda c: c.flush_cache(), "flushing the cache")

    def close(self) -> None:
        """Abort what is in flight (best effort, bounded), then stop the loop thread."""
        if self._is_closed:
            return
        self._is_closed = True
        if self._distributed is not None:
            self._distributed.close()
        try:
            self._pool.wait(self._close(), 10.0, "closing")
        except SGLangError as exc:
            log.warning("closing: %s", exc)
        self._pool.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- on the caller's thread -------------------------------------------------------------------

    def call_servers(self, make: Callable[[ServerClient], Awaitable]) -> concurrent.futures.Future:
        """Run `make(client)` on every live server concurrently without waiting (for a caller that
        must do its own part meanwhile, as an NCCL broadcast does); the future gives the answers."""
        return self._pool.call_servers(make)

    def _check_open(self) -> None:
        if self._is_closed:
            raise BackendMisuse("the SGLang engine is closed")

    def _raise_fatal(self) -> None:
        error = self._pool.pop_fatal()
        if error is not None:
            raise error
        if not self._pool.live():
            with self._lock:
                busy = bool(self._ids.live)
            if self._out.empty() and not busy:
                self._pool.check_live()

    # -- on the loop thread -----------------------------------------------------------------------

    def _emit(self, event: GenerationProgress | GenerationResult) -> None:
        if not isinstance(event, GenerationResult):
            self._out.put(event)
            return
        with self._lock:  # out and no longer live at once: whoever polled it sees nothing in flight
            self._out.put(event)
            self._ids.done(event.request_id)

    async def _close(self) -> None:
        await self._requests.close()
        await self._pool.close_session()
