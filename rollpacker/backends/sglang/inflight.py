"""`InflightRequests`: the requests an `SGLangEngine` has on its servers, kept on the pool's loop.

Each request is one streamed /generate with our own rid (one sample, never `n > 1`), sent to the
live server with the fewest outstanding requests.  Streamed chunks become `GenerationProgress`; the
final chunk becomes the `GenerationResult`; both go to the engine through `emit`.  `abort` posts
/abort_request per id; the server ends that stream with finish_reason "abort" and the tokens so far
(an abort sent before the server registered the rid is re-sent, at most 3 times).

A stream that breaks, or stalls past `stall_timeout_s` while not paused, has its server health
checked; when the pool marks it dead every request it held comes back as an abort.  A rejected or
malformed answer ends the request as an abort and goes to the pool's fatal errors (the engine's
next poll raises it).  Everything here runs on the loop thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aiohttp
from aiohttp.http_exceptions import HttpProcessingError
from attrs import define

from rollpacker.backends.errors import BackendProtocolError, SGLangError, ServerUnavailable
from rollpacker.backends.sglang.codec import StreamState, generate_body, parse_sse_line
from rollpacker.backends.sglang.http import is_out_of_files
from rollpacker.backends.sglang.pool import PooledServer, ServerPool, out_of_files_error
from rollpacker.core.protocols import GenerationProgress, GenerationRequest, GenerationResult

log = logging.getLogger(__name__)
_STREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)
_MAX_ABORT_SENDS = 3


@define(eq=False)
class Inflight:
    request: GenerationRequest
    server: PooledServer
    version: int
    state: StreamState
    task: asyncio.Task | None = None
    is_started: bool = False
    abort_sends: int = 0
    last_abort_at: float | None = None
    is_abort_wanted: bool = False


class InflightRequests:
    """The streams of the requests in flight on `pool`'s servers (loop thread only).

    emit: takes each progress and result (called on the loop thread).  version: the engine's weight
    version, stamped on a request when it is dispatched.  is_paused: whether the engine paused
    generation (a silent stream is then expected, not checked).
    """

    def __init__(self, pool: ServerPool, *, emit: Callable[[GenerationProgress | GenerationResult], None],
                 version: Callable[[], int], is_paused: Callable[[], bool], stall_timeout_s: float) -> None:
        self._pool = pool
        self._emit = emit
        self._version = version
        self._is_paused = is_paused
        self.stall_timeout_s = stall_timeout_s
        self._by_id: dict[str, Inflight] = {}
        self._is_out_of_files = False  # reported once: every request after it fails the same way

    def dispatch(self, requests: list[GenerationRequest], url: str | None) -> None:
        for request in requests:
            live = [s for s in self._pool.live() if url is None or s.url == url.rstrip("/")]
            state = StreamState(request.request_id, live[0].url if live else "-")
            if not live:
                self._emit(state.result("abort", self._version()))
                self._pool.add_fatal(ServerUnavailable(
                    f"request {request.request_id}: no live server ({url or 'any'}); "
                    + "; ".join(str(s.failure) for s in self._pool.servers if s.failure)))
                continue
            server = min(live, key=lambda s: len(s.outstanding))  # first of the least loaded
            inflight = Inflight(request, server, self._version(), state)
            server.outstanding.add(request.request_id)
            self._by_id[request.request_id] = inflight
            inflight.task = self._pool.loop.create_task(self._run(inflight))

    async def _run(self, inf: Inflight) -> None:
        server, rid = inf.server, inf.request.request_id
        try:
            inf.state.sent_at = time.time()
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
        except (ServerUnavailable, *_STREAM_ERRORS) as exc:
            self._finish(inf, "abort")
            await self._on_broken(server, rid, exc)
        except SGLangError as exc:  # rejected or malformed: relaunching would fail the same way
            self._pool.add_fatal(exc)
            self._finish(inf, "abort")

    async def _read_stream(self, inf: Inflight, resp: aiohttp.ClientResponse) -> None:
        while True:
            line = await self._read_line(inf, resp)
            if not line:
                return
            chunk = parse_sse_line(line, inf.server.url)
            if chunk is None:
                continue
            before = inf.state.num_tokens
            inf.state.apply(chunk)
            if inf.state.finish_reason is not None:
                return
            if inf.state.num_tokens > before:
                self._emit(inf.state.progress())
            if inf.is_abort_wanted and time.monotonic() - (inf.last_abort_at or 0.0) > 1.0:
                self._send_abort(inf)  # still running a second after an abort: it may have raced

    async def _read_line(self, inf: Inflight, resp: aiohttp.ClientResponse) -> bytes:
        """The next stream line, however long it takes to arrive.  Every `stall_timeout_s` of
        silence while not paused checks the server's health; the read itself is never cancelled,
        since a cancelled readline drops the bytes of a half-read line."""
        server = inf.server
        read = asyncio.ensure_future(resp.content.readline())
        try:
            while True:
                done, _ = await asyncio.wait({read}, timeout=self.stall_timeout_s)
                if done:
                    return read.result()
                if not self._is_paused():  # silent while running: is the server still there?
                    await server.client.health(retries=1)
        except (HttpProcessingError, ValueError) as exc:  # a line past MAX_STREAM_LINE: a broken server
            raise BackendProtocolError(f"server {server.url}: /generate rid={inf.request.request_id} "
                                       f"sent an unreadable stream line ({exc})") from exc
        finally:
            if not read.done():
                read.cancel()

    async def _on_broken(self, server: PooledServer, rid: str, exc: BaseException) -> None:
        """A request's stream failed: our own open-file limit is said once (it is no fault of the
        server, and a silent abort would hide it); anything else checks the server's health."""
        if is_out_of_files(exc):
            if not self._is_out_of_files:
                self._is_out_of_files = True
                self._pool.add_fatal(out_of_files_error(server.url, len(self._by_id) + 1))
            return
        if not isinstance(exc, ServerUnavailable):
            exc = ServerUnavailable(f"server {server.url}: /generate rid={rid} broke ({type(exc).__name__}: {exc})")
        await self._check_server(server, exc)

    def abort(self, rids: list[str]) -> None:
        for rid in rids:
            inf = self._by_id.get(rid)
            if inf is None or inf.is_abort_wanted:
                continue  # already finished (a normal race), or already aborting
            inf.is_abort_wanted = True
            if inf.is_started:
                self._send_abort(inf)

    def _send_abort(self, inf: Inflight) -> None:
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

        self._pool.loop.create_task(send())

    async def _check_server(self, server: PooledServer, cause: ServerUnavailable) -> None:
        """A request on `server` failed to reach it: if the pool marks it dead, every request it
        held comes back as an abort."""
        if not await self._pool.check_server(server, cause):
            return
        for rid in list(server.outstanding):
            inf = self._by_id.get(rid)
            if inf is not None and inf.task is not None:
                inf.task.cancel()

    def _finish(self, inf: Inflight, reason: str | None) -> None:
        rid = inf.request.request_id
        if self._by_id.pop(rid, None) is None:
            return
        inf.server.outstanding.discard(rid)
        self._emit(inf.state.result(reason, inf.version))

    async def close(self) -> None:
        pending = list(self._by_id.values())
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
