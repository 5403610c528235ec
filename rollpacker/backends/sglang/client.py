"""`SGLangEngine`: the rollout-engine Protocol over one or more SGLang servers' native HTTP API.

    engine = SGLangEngine(["http://10.0.0.1:30000", "http://10.0.0.2:30000"], expected_model="Qwen/...")
    engine.submit([GenerationRequest("rp000000000001", prompt_ids, max_new_tokens=512)])
    events = engine.poll(timeout=0.5)   # GenerationProgress / GenerationResult

Works against real SGLang (0.5.17+) and against `rollpacker serve` (the embedded engine behind the
same API), which is what CI tests it with.

Theory of operation
    An asyncio loop runs in a background thread and owns every connection and all request state;
    the Protocol's methods are synchronous and hand work to it (`call_soon_threadsafe`) or wait for
    a coroutine with a bound.  Each request is one streamed /generate with our own rid (one sample,
    never `n > 1`), sent to the live server with the fewest outstanding requests.  Streamed chunks
    become `GenerationProgress`; the final chunk becomes the `GenerationResult`.  `abort` posts
    /abort_request per id; the server ends that stream with finish_reason "abort" and the tokens so
    far (an abort sent before the server registered the rid is re-sent, at most 3 times).

Failures
    - A stream that breaks, or stalls past `stall_timeout_s` while not paused, triggers a health
      check of its server.  A server that fails it is marked dead: the error (naming it) is logged and
      kept in `server_failures`, and every request it held comes back as a `GenerationResult` with
      finish_reason "abort" and the tokens received so far.  The core treats an abort it did not ask
      for as an engine failure and relaunches the sample, which goes to a live server: no prompt lost.
    - With no live server left, `submit` and `poll` raise `ServerUnavailable` naming every server.
    - A server that rejects a request (HTTP 4xx) or answers something malformed: the request comes
      back as an abort and the next `poll` raises `ServerRejected` / `BackendProtocolError` naming the
      server (relaunching would fail the same way).
    - Control calls are retried a bounded number of times; `poll(timeout)` never waits past timeout.

Weight updates: pause (mode "retract" by default) -> /update_weights_from_disk on every server ->
continue.  A mapping of tensors is first written as a safetensors directory (under `weights_dir`,
which must be visible to every server: a shared filesystem across nodes).  The NCCL fast path is in
`weights.DistributedWeightSync`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import queue
import shutil
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
from attrs import define, field

from rollpacker.backends.sglang.codec import (
    BackendProtocolError,
    SGLangError,
    ServerRejected,
    ServerUnavailable,
    StreamState,
    generate_body,
    parse_sse_line,
)
from rollpacker.backends.sglang.http import HttpConfig, ServerClient
from rollpacker.core.errors import ConfigError, SchedulerMisuse
from rollpacker.core.protocols import GenerationProgress, GenerationRequest, GenerationResult

log = logging.getLogger(__name__)
_STREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)
_MAX_ABORT_SENDS = 3


@define(eq=False)
class _Server:
    client: ServerClient
    capacity: int = 0
    outstanding: set = field(factory=set)
    """rids sent here whose result is not out yet."""
    failure: SGLangError | None = None
    is_checking: bool = False

    @property
    def url(self) -> str:
        return self.client.url


@define(eq=False)
class _Inflight:
    request: GenerationRequest
    server: _Server
    version: int
    state: StreamState
    task: asyncio.Task | None = None
    is_started: bool = False
    abort_sends: int = 0
    last_abort_at: float | None = None
    is_abort_wanted: bool = False


class SGLangEngine:
    """Rollout engine over SGLang(-compatible) servers at `urls`.

    expected_model: if set, each server's /get_model_info model_path must name it (same path or same
    final component), else construction fails naming the server.  capacity_per_server: running-batch
    limit per server (None: the server's max_running_requests if it reports one, else 64).
    pause_mode: SGLang's /pause_generation mode ("retract" keeps requests, recomputing their cache
    with the new weights; "in_place" keeps the cache; "abort" aborts them).  weights_dir: where
    `update_weights(mapping)` writes safetensors (None: a temporary folder, single node only).
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
        self.stall_timeout_s = stall_timeout_s
        self.weights_dir = None if weights_dir is None else Path(weights_dir)
        self.model_config_dir = None if model_config_dir is None else Path(model_config_dir)
        self.server_failures: list[SGLangError] = []
        """Every server marked dead, with why (the message names it)."""
        self._version = weight_version
        self._lock = threading.Lock()
        self._live_ids: set[str] = set()  # guarded by _lock: submitted, result not yet queued
        self._seen_ids: set[str] = set()
        self._fatal: list[SGLangError] = []  # guarded by _lock: raised by the next poll
        self._out: queue.Queue = queue.Queue()
        self._held: list = []  # events taken from _out by a poll that raised instead (caller thread)
        self._is_paused = False
        self._is_closed = False
        self._inflight: dict[str, _Inflight] = {}  # loop thread only
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rollpacker-sglang", daemon=True)
        self._thread.start()
        try:
            self._servers: list[_Server] = self._wait(
                self._start(urls, expected_model, capacity_per_server), start_timeout_s, "connecting")
        except BaseException:
            self._shutdown()
            raise

    # -- Protocol ---------------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return sum(s.capacity for s in self._servers if s.failure is None)

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self._servers]

    def live_urls(self) -> list[str]:
        return [s.url for s in self._servers if s.failure is None]

    def outstanding(self) -> dict[str, int]:
        """Requests in flight per server URL (a snapshot)."""
        return {s.url: len(s.outstanding) for s in self._servers}

    def submit(self, requests: Sequence[GenerationRequest], *, server: str | None = None) -> None:
        """Queue `requests`, each to the live server with the fewest outstanding requests (or to the
        server whose URL is `server`).  Every request is validated before any is queued."""
        self._check_open()
        if server is not None and server.rstrip("/") not in self.urls:
            raise ConfigError(f"submit: unknown server {server!r}; servers are {self.urls}")
        self._check_live()
        with self._lock:
            batch: set[str] = set()
            for r in requests:
                if not isinstance(r, GenerationRequest):
                    raise ConfigError(f"submit expects GenerationRequest, got {type(r).__name__}")
                if not isinstance(r.request_id, str) or not r.request_id:
                    raise ConfigError(f"request_id must be a non-empty string, got {r.request_id!r}")
                if not r.prompt_ids:
                    raise ConfigError(f"request {r.request_id!r}: prompt_ids is empty")
                if r.request_id in self._live_ids or r.request_id in batch:
                    raise SchedulerMisuse(f"request {r.request_id!r}: this id is already running")
                batch.add(r.request_id)
            self._live_ids |= batch
            self._seen_ids |= batch
        self._loop.call_soon_threadsafe(self._dispatch, list(requests), server)

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
                idle = not self._live_ids
            wait = 0.05 if idle else 0.2
            if deadline is not None:
                wait = min(wait, max(0.0, deadline - time.monotonic()))
            try:
                events.append(self._out.get(timeout=wait))
                break
            except queue.Empty:
                with self._lock:
                    if self._fatal:
                        break
                if (deadline is not None and time.monotonic() >= deadline) or (deadline is None and idle):
                    break
        while True:
            try:
                events.append(self._out.get_nowait())
            except queue.Empty:
                break
        with self._lock:
            has_fatal = bool(self._fatal)
        if has_fatal:  # raise first; these events come with the next poll
            self._held = events + self._held
            self._raise_fatal()
        events, self._held = self._held + events, []
        return events

    def abort(self, request_ids: Sequence[str]) -> None:
        """Abort these requests; each comes back from `poll` as a result (finish_reason "abort"
        with its partial tokens, or its normal finish if it ended first)."""
        self._check_open()
        unknown = [r for r in request_ids if r not in self._seen_ids]
        if unknown:
            raise SchedulerMisuse(f"abort: unknown request id(s) {unknown[:5]!r}")
        self._loop.call_soon_threadsafe(self._abort, list(request_ids))

    def pause(self) -> None:
        self._check_open()
        self._is_paused = True
        self._on_live_servers(lambda c: c.pause(self.pause_mode), "pausing")

    def resume(self) -> None:
        self._check_open()
        try:
            self._on_live_servers(lambda c: c.resume(), "continuing")
        finally:
            self._is_paused = False

    def update_weights(self, weights: Mapping[str, Any] | str | os.PathLike, version: int) -> None:
        """pause -> /update_weights_from_disk on every live server -> continue (the pause and
        continue are skipped when the caller already paused)."""
        self._check_open()
        written = None
        if isinstance(weights, (str, os.PathLike)):
            path = str(weights)
        else:
            from rollpacker.backends.sglang.weights import write_safetensors_dir

            written = path = str(write_safetensors_dir(weights, self.weights_dir, self.model_config_dir))
        was_paused = self._is_paused
        try:
            if not was_paused:
                self.pause()
            try:
                self._on_live_servers(lambda c: c.update_weights_from_disk(path, version), "updating weights",
                                      timeout=self.http.weights_timeout_s + 5)
                self._version = int(version)
            finally:
                if not was_paused:
                    self.resume()
        finally:
            if written is not None and self.weights_dir is None:
                shutil.rmtree(written, ignore_errors=True)

    def flush_cache(self) -> None:
        """/flush_cache on every live server; only when nothing is in flight (SGLang refuses then)."""
        self._check_open()
        with self._lock:
            if self._live_ids:
                raise SchedulerMisuse(f"flush_cache: {len(self._live_ids)} request(s) still in flight")
        self._on_live_servers(lambda c: c.flush_cache(), "flushing the cache")

    def close(self) -> None:
        """Abort what is in flight (best effort, bounded), then stop the loop thread."""
        if self._is_closed:
            return
        self._is_closed = True
        try:
            self._wait(self._close(), 10.0, "closing")
        except SGLangError as exc:
            log.warning("closing: %s", exc)
        self._shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- on the caller's thread -------------------------------------------------------------------

    def _wait(self, coro: Awaitable, timeout: float, what: str):
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ServerUnavailable(f"{what}: no answer from {self.urls} within {timeout:.0f} s") from None

    def call_servers(self, make: Callable[[ServerClient], Awaitable]) -> concurrent.futures.Future:
        """Run `make(client)` on every live server concurrently without waiting (for a caller that
        must do its own part meanwhile, as an NCCL broadcast does); the future gives the answers."""
        live = [s.client for s in self._servers if s.failure is None]

        async def all_of() -> list:
            return await asyncio.gather(*(make(c) for c in live))

        return asyncio.run_coroutine_threadsafe(all_of(), self._loop)

    def _on_live_servers(self, make: Callable[[ServerClient], Awaitable], what: str,
                         timeout: float | None = None) -> list:
        self._check_live()
        future = self.call_servers(make)
        try:
            return future.result(timeout or self.http.control_timeout_s * self.http.retries + 5)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ServerUnavailable(f"{what}: no answer from {self.live_urls()} in time") from None

    def _check_open(self) -> None:
        if self._is_closed:
            raise SchedulerMisuse("the SGLang engine is closed")

    def _check_live(self) -> None:
        if all(s.failure is not None for s in self._servers):
            causes = "; ".join(str(s.failure) for s in self._servers)
            raise ServerUnavailable(f"no live SGLang server left: {causes}")

    def _raise_fatal(self) -> None:
        with self._lock:
            error = self._fatal.pop(0) if self._fatal else None
        if error is not None:
            raise error
        if self._servers and all(s.failure is not None for s in self._servers):
            with self._lock:
                busy = bool(self._live_ids)
            if self._out.empty() and not busy:
                self._check_live()

    def _shutdown(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    # -- on the loop thread -----------------------------------------------------------------------

    async def _start(self, urls, expected_model, capacity_per_server) -> list[_Server]:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=False),
            timeout=aiohttp.ClientTimeout(total=None, connect=self.http.connect_timeout_s),
        )
        servers = [_Server(ServerClient(u, self._session, self.http)) for u in urls]

        async def check(server: _Server) -> None:
            await server.client.health()
            info = await server.client.model_info()
            if expected_model is not None and not _same_model(expected_model, str(info["model_path"])):
                raise ServerRejected(
                    f"server {server.url} serves model {info['model_path']!r}, not the expected {expected_model!r}")
            server.capacity = capacity_per_server or await server.client.max_running_requests() or 64

        try:
            await asyncio.gather(*(check(s) for s in servers))
        except BaseException:
            await self._session.close()
            raise
        return servers

    def _dispatch(self, requests: list[GenerationRequest], url: str | None) -> None:
        for request in requests:
            live = [s for s in self._servers if s.failure is None and (url is None or s.url == url.rstrip("/"))]
            state = StreamState(request.request_id, live[0].url if live else "-")
            if not live:
                self._emit(state.result("abort", self._version))
                self._add_fatal(ServerUnavailable(
                    f"request {request.request_id}: no live server ({url or 'any'}); "
                    + "; ".join(str(s.failure) for s in self._servers if s.failure)))
                continue
            server = min(live, key=lambda s: len(s.outstanding))  # first of the least loaded
            inflight = _Inflight(request, server, self._version, state)
            server.outstanding.add(request.request_id)
            self._inflight[request.request_id] = inflight
            inflight.task = self._loop.create_task(self._run(inflight))

    async def _run(self, inf: _Inflight) -> None:
        server, rid = inf.server, inf.request.request_id
        try:
            resp = await server.client.open_generate(generate_body(inf.request))
            try:
                inf.is_started = True
                if inf.is_abort_wanted:
                    self._send_abort(inf)
                await self._read_stream(inf, resp)
            finally:
                resp.release()
            if inf.state.finish_reason is None:
                raise ServerUnavailable(f"server {server.url}: /generate rid={rid} ended before the request finished")
            self._finish(inf, None)
        except asyncio.CancelledError:
            self._finish(inf, "abort")
            raise
        except ServerUnavailable as exc:
            self._finish(inf, "abort")
            await self._check_server(server, exc)
        except _STREAM_ERRORS as exc:
            self._finish(inf, "abort")
            await self._check_server(server, ServerUnavailable(
                f"server {server.url}: /generate rid={rid} broke ({type(exc).__name__}: {exc})"))
        except SGLangError as exc:  # rejected or malformed: relaunching would fail the same way
            self._add_fatal(exc)
            self._finish(inf, "abort")

    async def _read_stream(self, inf: _Inflight, resp: aiohttp.ClientResponse) -> None:
        server = inf.server
        while True:
            try:
                line = await asyncio.wait_for(resp.content.readline(), self.stall_timeout_s)
            except asyncio.TimeoutError:
                if not self._is_paused:  # silent while running: is the server still there?
                    await server.client.health(retries=1)
                continue
            if not line:
                return
            chunk = parse_sse_line(line, server.url)
            if chunk is None:
                continue
            before = inf.state.num_tokens
            inf.state.apply(chunk)
            if inf.state.finish_reason is not None:
                return
            if inf.state.num_tokens > before:
                self._out.put(inf.state.progress())
            if inf.is_abort_wanted and time.monotonic() - (inf.last_abort_at or 0.0) > 1.0:
                self._send_abort(inf)  # still running a second after an abort: it may have raced

    def _abort(self, rids: list[str]) -> None:
        for rid in rids:
            inf = self._inflight.get(rid)
            if inf is None or inf.is_abort_wanted:
                continue  # already finished (a normal race), or already aborting
            inf.is_abort_wanted = True
            if inf.is_started:
                self._send_abort(inf)

    def _send_abort(self, inf: _Inflight) -> None:
        if inf.abort_sends >= _MAX_ABORT_SENDS or inf.server.failure is not None:
            return
        inf.abort_sends += 1
        inf.last_abort_at = time.monotonic()

        async def send() -> None:
            try:
                await inf.server.client.abort(inf.request.request_id)
            except ServerUnavailable as exc:
                await self._check_server(inf.server, exc)
            except SGLangError as exc:
                log.warning("abort of %s: %s", inf.request.request_id, exc)

        self._loop.create_task(send())

    async def _check_server(self, server: _Server, cause: ServerUnavailable) -> None:
        """A request on `server` failed to reach it: mark it dead unless it passes a health check."""
        if server.failure is not None or server.is_checking:
            return
        server.is_checking = True
        try:
            await server.client.health(retries=2)
            log.warning("%s (the server still answers /health; only that request is aborted)", cause)
            return
        except SGLangError:
            pass
        finally:
            server.is_checking = False
        server.failure = ServerUnavailable(f"server {server.url} failed: {cause}")
        self.server_failures.append(server.failure)
        doomed = [self._inflight[r] for r in list(server.outstanding) if r in self._inflight]
        log.error("%s; its %d in-flight request(s) come back as aborts", server.failure, len(doomed))
        for inf in doomed:
            if inf.task is not None:
                inf.task.cancel()

    def _finish(self, inf: _Inflight, reason: str | None) -> None:
        rid = inf.request.request_id
        if self._inflight.pop(rid, None) is None:
            return
        inf.server.outstanding.discard(rid)
        self._emit(inf.state.result(reason, inf.version))

    def _emit(self, result: GenerationResult) -> None:
        self._out.put(result)
        with self._lock:
            self._live_ids.discard(result.request_id)

    def _add_fatal(self, error: SGLangError) -> None:
        log.error("%s", error)
        with self._lock:
            self._fatal.append(error)

    async def _close(self) -> None:
        pending = list(self._inflight.values())
        for inf in pending:
            if inf.is_started and inf.server.failure is None:
                try:
                    await asyncio.wait_for(inf.server.client.abort(inf.request.request_id), 2.0)
                except (SGLangError, asyncio.TimeoutError):
                    pass
        tasks = [inf.task for inf in pending if inf.task is not None]
        if tasks:
            _, still = await asyncio.wait(tasks, timeout=3.0)
            for task in still:
                task.cancel()
            await asyncio.gather(*still, return_exceptions=True)
        await self._session.close()


def _same_model(expected: str, reported: str) -> bool:
    norm = lambda p: os.path.normpath(p.rstrip("/"))  # noqa: E731
    return norm(expected) == norm(reported) or os.path.basename(norm(expected)) == os.path.basename(norm(reported))
