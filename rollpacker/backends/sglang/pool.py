"""`ServerPool`: the SGLang servers behind one `SGLangEngine`, and the asyncio loop that talks to them.

The pool owns a background thread running an asyncio loop, the aiohttp session on it, and one
`PooledServer` per URL with its liveness.  Construction checks every server (/health, the model it
serves, its running-batch limit) within a bound.  A server that fails a health check after a broken
request is marked dead for good (`failures` keeps why); `call_servers` and `on_live_servers` run a
control call on every live server.  Errors that must reach the engine's caller (a rejected or
malformed answer) are collected here and raised by its next poll.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import resource
import threading
from collections.abc import Awaitable, Callable, Sequence

import aiohttp
from attrs import define, field

from rollpacker.backends.errors import SGLangError, ServerRejected, ServerUnavailable
from rollpacker.backends.sglang.http import HttpConfig, ServerClient
from rollpacker.backends.sglang.served_model import model_mismatch

log = logging.getLogger(__name__)

MAX_STREAM_LINE = 64 * 1024 * 1024
"""Longest stream line read.  SGLang streams a request's output ids and log-probs cumulatively by
default, about 30 bytes per token in every line: past aiohttp's default line limit (512 KiB) at
about 16k tokens, 1 MB at 32k; 64 MiB holds two million tokens."""


def raise_open_file_limit() -> tuple[int, int]:
    """Raise this process's soft open-file limit to its hard limit (each streamed request holds a
    socket: a soft limit of 256 or 1024 is too few for thousands of requests in flight).
    Returns the (soft, hard) limits now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard and (hard == resource.RLIM_INFINITY or soft < hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:  # some systems cap it below the hard limit
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, hard, exc)
    return soft, hard


def out_of_files_error(url: str, in_flight: int) -> SGLangError:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return SGLangError(
        f"cannot open a connection to {url}: this process reached its open-file limit (RLIMIT_NOFILE soft {soft}, "
        f"hard {hard}) with {in_flight} requests in flight; raise the limit (`ulimit -n`, or the hard limit in "
        "/etc/security/limits.conf) or run fewer requests at once")


@define(eq=False)
class PooledServer:
    client: ServerClient
    capacity: int = 0
    outstanding: set = field(factory=set)
    """rids sent here whose result is not out yet."""
    failure: SGLangError | None = None
    is_checking: bool = False

    @property
    def url(self) -> str:
        return self.client.url


class ServerPool:
    """The servers at `urls`, checked at construction (see `SGLangEngine` for the arguments);
    construction fails, naming the server, if one does not answer or serves another model."""

    def __init__(self, urls: Sequence[str], http: HttpConfig, *, expected_model: str | None,
                 capacity_per_server: int | None, start_timeout_s: float) -> None:
        self.http = http
        self._urls = [u.rstrip("/") for u in urls]  # known before the servers are (timeout messages)
        self.failures: list[SGLangError] = []
        """Every server marked dead, with why (the message names it)."""
        self._fatal: list[SGLangError] = []  # guarded by _lock: raised by the engine's next poll
        self._lock = threading.Lock()
        raise_open_file_limit()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="rollpacker-sglang", daemon=True)
        self._thread.start()
        try:
            self.servers: list[PooledServer] = self.wait(
                self._start(self._urls, expected_model, capacity_per_server), start_timeout_s, "connecting")
        except BaseException:
            self.shutdown()
            raise

    # -- liveness ---------------------------------------------------------------------------------

    @property
    def urls(self) -> list[str]:
        return list(self._urls)

    def live(self) -> list[PooledServer]:
        return [s for s in self.servers if s.failure is None]

    def live_urls(self) -> list[str]:
        return [s.url for s in self.live()]

    @property
    def capacity(self) -> int:
        return sum(s.capacity for s in self.live())

    def check_live(self) -> None:
        """Raise `ServerUnavailable` naming every server when none is live."""
        if not self.live():
            causes = "; ".join(str(s.failure) for s in self.servers)
            raise ServerUnavailable(f"no live SGLang server left: {causes}")

    async def check_server(self, server: PooledServer, cause: ServerUnavailable) -> bool:
        """A request on `server` failed to reach it: mark it dead unless it passes a health check.
        True when this call marked it dead (its outstanding requests are then lost)."""
        if server.failure is not None or server.is_checking:
            return False
        server.is_checking = True
        try:
            await server.client.health(retries=2)
            log.warning("%s (the server still answers /health; only that request is aborted)", cause)
            return False
        except SGLangError:
            pass
        finally:
            server.is_checking = False
        server.failure = ServerUnavailable(f"server {server.url} failed: {cause}")
        self.failures.append(server.failure)
        log.error("%s; its %d in-flight request(s) come back as aborts", server.failure, len(server.outstanding))
        return True

    # -- calls from the caller's thread -----------------------------------------------------------

    def wait(self, coro: Awaitable, timeout: float, what: str):
        """Run `coro` on the loop and wait for it at most `timeout` seconds."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ServerUnavailable(f"{what}: no answer from {self.urls} within {timeout:.0f} s") from None

    def call_servers(self, make: Callable[[ServerClient], Awaitable]) -> concurrent.futures.Future:
        """Run `make(client)` on every live server concurrently without waiting; the future gives
        the answers."""
        live = [s.client for s in self.live()]

        async def all_of() -> list:
            return await asyncio.gather(*(make(c) for c in live))

        return asyncio.run_coroutine_threadsafe(all_of(), self.loop)

    def on_live_servers(self, make: Callable[[ServerClient], Awaitable], what: str,
                        timeout: float | None = None) -> list:
        """`call_servers`, waiting for the answers (by default as long as a retried control call)."""
        self.check_live()
        future = self.call_servers(make)
        try:
            return future.result(timeout or self.http.control_timeout_s * self.http.retries + 5)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ServerUnavailable(f"{what}: no answer from {self.live_urls()} in time") from None

    def shutdown(self) -> None:
        """Stop the loop thread (after `close_session`, when the pool was built)."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)

    # -- errors for the engine's next poll (any thread) -------------------------------------------

    def add_fatal(self, error: SGLangError) -> None:
        log.error("%s", error)
        with self._lock:
            self._fatal.append(error)

    def has_fatal(self) -> bool:
        with self._lock:
            return bool(self._fatal)

    def pop_fatal(self) -> SGLangError | None:
        with self._lock:
            return self._fatal.pop(0) if self._fatal else None

    # -- on the loop thread -----------------------------------------------------------------------

    async def _start(self, urls: list[str], expected_model: str | None,
                     capacity_per_server: int | None) -> list[PooledServer]:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=False),
            read_bufsize=MAX_STREAM_LINE // 2,  # aiohttp reads lines of up to twice this
            timeout=aiohttp.ClientTimeout(total=None, connect=self.http.connect_timeout_s),
        )
        servers = [PooledServer(ServerClient(u, self._session, self.http)) for u in urls]

        async def check(server: PooledServer) -> None:
            await server.client.health()
            info = await server.client.model_info()
            mismatch = None if expected_model is None else model_mismatch(expected_model, info)
            if mismatch is not None:  # before any weight moves: the server is left as it is
                raise ServerRejected(f"server {server.url} {mismatch}")
            settings = await server.client.server_info()
            server.capacity = capacity_per_server or running_limit(settings)
            if server.capacity is None:
                server.capacity = DEFAULT_CAPACITY
                log.warning("server %s reports no running-request limit; assuming %d (pass capacity_per_server)",
                            server.url, DEFAULT_CAPACITY)
            if settings.get("incremental_streaming_output") is False:
                log.warning("server %s streams cumulative output (SGLang's default): every chunk repeats all the "
                            "tokens and log-probs so far, quadratic in the response length; start it with "
                            "--incremental-streaming-output (launch_servers does)", server.url)

        try:
            await asyncio.gather(*(check(s) for s in servers))
        except BaseException:
            await self._session.close()
            raise
        return servers

    async def close_session(self) -> None:
        await self._session.close()


DEFAULT_CAPACITY = 64
"""Running-request limit assumed for a server that reports none."""


def running_limit(settings: dict) -> int | None:
    """A server's running-request limit from its /server_info: `max_running_requests` when it was
    started with one, else what SGLang resolved (`effective_max_running_requests_per_dp`, summed over
    its data-parallel ranks); None when it reports neither."""
    limit = settings.get("max_running_requests")
    if isinstance(limit, int) and limit > 0:
        return limit
    states = settings.get("internal_states")
    per_dp = [st.get("effective_max_running_requests_per_dp") for st in states or () if isinstance(st, dict)]
    per_dp = [n for n in per_dp if isinstance(n, int) and n > 0]
    return sum(per_dp) if per_dp else None
