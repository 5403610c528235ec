"""One SGLang server's native HTTP API, as async calls with bounded retries and errors naming it.

Control calls (health, model info, abort, pause, continue, weight updates, memory release and
resume, cache flush) are retried
on connection errors and 503 a few times with a short backoff; /generate is opened once (it is not
idempotent) and handed back as a response to stream from.  Every error is a `ServerUnavailable`
(no answer), `ServerRejected` (an HTTP error or `success: false`) or `BackendProtocolError` (an
answer that is not SGLang's format, or not even HTTP), and its message starts with the server's URL;
`rollpacker.backends.errors` holds them.
"""

from __future__ import annotations

import asyncio
import errno
from typing import Any

import aiohttp
from attrs import frozen

from rollpacker.backends.errors import BackendProtocolError, ServerRejected, ServerUnavailable


@frozen
class HttpConfig:
    connect_timeout_s: float = 5.0
    """Time to open a connection."""
    control_timeout_s: float = 30.0
    """Whole-call limit of a control call (a weight update gets `weights_timeout_s`)."""
    weights_timeout_s: float = 600.0
    retries: int = 3
    """Attempts of a control call, in all."""
    backoff_s: float = 0.2
    """Wait before the second attempt; doubles each time."""
    max_opening: int = 64
    """Most /generate requests opening a connection to one server at once (the rest wait their turn):
    thousands of connects at once overflow a server's accept backlog and time out."""


_OUT_OF_FILES = (errno.EMFILE, errno.ENFILE)
_NETWORK_ERRORS = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError, OSError)


def is_out_of_files(exc: BaseException) -> bool:
    """Whether `exc` (or what caused it) is the process or the system running out of file descriptors."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in _OUT_OF_FILES:
            return True
        os_error = getattr(exc, "os_error", None)  # aiohttp's ClientConnectorError keeps the OS error
        if isinstance(os_error, OSError) and os_error.errno in _OUT_OF_FILES:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class ServerClient:
    """The native API of the server at `url`, over a shared aiohttp session."""

    def __init__(self, url: str, session: aiohttp.ClientSession, config: HttpConfig) -> None:
        self.url = url.rstrip("/")
        self.session = session
        self.config = config
        self._opening = asyncio.Semaphore(config.max_opening)
        self._renamed: dict[tuple[str, ...], str] = {}

    async def call(self, method: str, path: str, body: Any = None, *, timeout_s: float | None = None,
                   retries: int | None = None, expect_json: bool = True) -> Any:
        """One control call; the JSON answer (or the text when `expect_json` is False)."""
        cfg = self.config
        attempts = max(1, cfg.retries if retries is None else retries)
        timeout = aiohttp.ClientTimeout(total=timeout_s or cfg.control_timeout_s, connect=cfg.connect_timeout_s)
        last: Exception | None = None
        for attempt in range(attempts):
            if attempt:
                await asyncio.sleep(cfg.backoff_s * 2 ** (attempt - 1))
            try:
                async with self.session.request(method, self.url + path, json=body, timeout=timeout) as resp:
                    text = await resp.text(errors="replace")
                    if resp.status == 503:
                        last = ServerUnavailable(f"server {self.url}: {path} answered 503 (not ready): {text[:200]}")
                        continue
                    if resp.status >= 400:
                        raise ServerRejected(f"server {self.url}: {path} answered HTTP {resp.status}: {text[:300]}")
                    if not expect_json:
                        return text
                    try:
                        data = await resp.json(content_type=None) if text.strip() else {}
                    except ValueError:
                        raise BackendProtocolError(f"server {self.url}: {path} answered non-JSON: {text[:200]!r}") from None
                    if isinstance(data, dict) and data.get("success") is False:
                        raise ServerRejected(f"server {self.url}: {path} failed: {data.get('message')}")
                    return data
            except aiohttp.ClientResponseError as exc:  # an answer aiohttp cannot parse as HTTP
                raise BackendProtocolError(f"server {self.url}: {path} answered something that is not HTTP "
                                           f"({exc.message})") from exc
            except _NETWORK_ERRORS as exc:
                last = ServerUnavailable(f"server {self.url}: {path} unreachable ({type(exc).__name__}: {exc})")
        assert last is not None
        raise last

    async def call_renamed(self, method: str, paths: tuple[str, ...], **kwargs) -> Any:
        """A control call whose path SGLang renamed (newest name first; an older server answers 404
        to it): the first path the server knows, remembered for the next calls."""
        known = self._renamed.get(paths)
        for path in (known,) if known else paths:
            try:
                answer = await self.call(method, path, **kwargs)
            except ServerRejected as exc:
                if path == paths[-1] or "HTTP 404" not in str(exc):
                    raise
                continue
            self._renamed[paths] = path
            return answer
        raise AssertionError("unreachable")

    async def health(self, retries: int | None = None) -> None:
        await self.call("GET", "/health", retries=retries, expect_json=False)

    async def model_info(self) -> dict:
        info = await self.call_renamed("GET", ("/model_info", "/get_model_info"))
        if not isinstance(info, dict) or "model_path" not in info:
            raise BackendProtocolError(f"server {self.url}: /get_model_info has no model_path: {str(info)[:200]}")
        return info

    async def server_info(self) -> dict:
        """The server's settings (SGLang: its server args), or {} if it does not report them."""
        try:
            info = await self.call_renamed("GET", ("/server_info", "/get_server_info"), retries=1)
        except (ServerRejected, BackendProtocolError):
            return {}
        return info if isinstance(info, dict) else {}

    async def abort(self, rid: str) -> None:
        await self.call("POST", "/abort_request", {"rid": rid}, expect_json=False)

    async def pause(self, mode: str) -> None:
        await self.call("POST", "/pause_generation", {"mode": mode})

    async def resume(self) -> None:
        await self.call("POST", "/continue_generation", {})

    async def flush_cache(self) -> None:
        await self.call("POST", "/flush_cache", expect_json=False)

    async def release_memory_occupation(self, tags: list[str]) -> dict:
        """Free the server's `tags` ("weights", "kv_cache"); SGLang needs --enable-memory-saver."""
        return await self.call("POST", "/release_memory_occupation", {"tags": tags},
                               timeout_s=self.config.weights_timeout_s, retries=1)

    async def resume_memory_occupation(self, tags: list[str]) -> dict:
        return await self.call("POST", "/resume_memory_occupation", {"tags": tags},
                               timeout_s=self.config.weights_timeout_s, retries=1)

    async def update_weights_from_disk(self, model_path: str, version: int) -> dict:
        body = {"model_path": model_path, "weight_version": str(version)}
        return await self.call("POST", "/update_weights_from_disk", body, timeout_s=self.config.weights_timeout_s,
                               retries=1)

    async def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int,
                                        world_size: int, group_name: str, backend: str) -> dict:
        body = {"master_address": master_address, "master_port": master_port, "rank_offset": rank_offset,
                "world_size": world_size, "group_name": group_name, "backend": backend}
        return await self.call("POST", "/init_weights_update_group", body,
                               timeout_s=self.config.weights_timeout_s, retries=1)

    async def weight_update_session(self, edge: str) -> dict | None:
        """`edge` "begin" or "end": SGLang's weight-update session (0.5.23 refuses a distributed
        update outside one); None from a server that has no such call (older SGLang: HTTP 404)."""
        try:
            return await self.call("POST", f"/{edge}_weight_update", {}, timeout_s=self.config.weights_timeout_s,
                                   retries=1)
        except ServerRejected as exc:
            if "HTTP 404" in str(exc):
                return None
            raise

    async def destroy_weights_update_group(self, group_name: str) -> dict:
        return await self.call("POST", "/destroy_weights_update_group", {"group_name": group_name}, retries=1)

    async def update_weights_from_distributed(self, names: list[str], dtypes: list[str],
                                              shapes: list[list[int]], group_name: str, version: int) -> dict:
        body = {"names": names, "dtypes": dtypes, "shapes": shapes, "group_name": group_name,
                "weight_version": str(version)}
        return await self.call("POST", "/update_weights_from_distributed", body,
                               timeout_s=self.config.weights_timeout_s, retries=1)

    async def open_generate(self, body: dict) -> aiohttp.ClientResponse:
        """POST /generate (streamed); the caller reads and releases the response.  A connection
        that could not be opened (refused or timed out: the request never reached the server) is
        tried again, `retries` attempts in all."""
        cfg = self.config
        timeout = aiohttp.ClientTimeout(total=None, connect=cfg.connect_timeout_s, sock_connect=cfg.connect_timeout_s)
        attempts = max(1, cfg.retries)
        for attempt in range(attempts):
            try:
                async with self._opening:
                    resp = await self.session.post(self.url + "/generate", json=body, timeout=timeout)
                break
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
                if attempt + 1 >= attempts or is_out_of_files(exc):
                    raise ServerUnavailable(f"server {self.url}: /generate unreachable ({type(exc).__name__}: {exc})") from exc
                await asyncio.sleep(cfg.backoff_s * 2**attempt)
            except _NETWORK_ERRORS as exc:
                raise ServerUnavailable(f"server {self.url}: /generate unreachable ({type(exc).__name__}: {exc})") from exc
        if resp.status >= 400:
            text = await resp.text(errors="replace")
            resp.release()
            if resp.status >= 500:
                raise ServerUnavailable(f"server {self.url}: /generate answered HTTP {resp.status}: {text[:300]}")
            raise ServerRejected(f"server {self.url}: /generate rid={body.get('rid')} answered HTTP {resp.status}: {text[:300]}")
        return resp
