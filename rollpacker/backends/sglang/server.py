"""The server of `rollpacker serve` (its command line: `serve`): any `RolloutEngine` behind the subset
of SGLang's native HTTP API that RL uses.

Endpoints (shapes as SGLang's, see `codec`): GET /health, /health_generate, /get_model_info,
/get_server_info; POST /generate (stream or not), /abort_request {rid, abort_all},
/pause_generation {mode}, /continue_generation, /update_weights_from_disk {model_path,
weight_version}, /init_weights_update_group and /update_weights_from_distributed (the engine joins
the trainer's group with torch.distributed, gloo on CPU, and receives each bucket by broadcast; see
`weights`), /release_memory_occupation and /resume_memory_occupation {tags} (colocated mode: the
engine frees, then allocates again, its "weights" and "kv_cache"), /flush_cache.  The weight
endpoints are in `server_weights`.  With
`--log-calls` every call is logged with its wall-clock time (`call POST /generate at=...`).
Input is token ids only (`input_ids`): this server does no
tokenization.  With the model's tokenizer it decodes each response into `text` (the final chunk
holds all of it) and honours `stop` strings.  Sampling params: `generate_params.HONOURED_PARAMS`; SGLang's others
only at the value that turns them off; anything else is a 400 naming the field, never ignored.

Theory of operation: the engine's API is synchronous and thread-safe; aiohttp runs on one event
loop.  Submits, aborts and pause/continue are quick calls made from the loop; a weight update blocks,
so it runs in the default executor.  One pump thread calls `engine.poll` and hands every event to the
loop, which routes it to the waiting handler's queue by request id.  A client that goes away, streaming
or not, aborts its request, as SGLang does (aiohttp cancels the handler of a closed connection:
`handler_cancellation=True`), quietly.  Streamed progress chunks carry the running count only (the
engine protocol reports counts); the final chunk carries every token id and log-prob.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

try:  # optional (the `serve` extra): `rollpacker --help` must work without it
    from aiohttp import web
except ImportError:  # pragma: no cover
    web = None

from rollpacker.backends.sglang.codec import progress_chunk, result_chunk, sse, stop_match
from rollpacker.backends.sglang.generate_params import BadRequest, request_from_body
from rollpacker.backends.sglang.server_weights import WeightEndpoints, error_reply, failed_reply
from rollpacker.core.protocols import GenerationProgress, GenerationRequest, GenerationResult, RolloutEngine

log = logging.getLogger(__name__)
PAUSE_MODES = ("abort", "retract", "in_place")


class EngineServer(WeightEndpoints):
    """The aiohttp application over one engine.  `model_path` is what /get_model_info reports;
    `ignore_eos` says whether the engine was built to never stop on EOS (`rollpacker serve --ignore-eos`;
    a request's own `sampling_params.ignore_eos` does the same for that request);
    `tokenizer` (optional) decodes each response into `text` and lets requests use `stop` strings."""

    def __init__(self, engine: RolloutEngine, model_path: str, *, weight_version: int = 0,
                 ignore_eos: bool = False, tokenizer: Any | None = None, log_calls: bool = False) -> None:
        self.engine = engine
        self.model_path = model_path
        """The weights' directory: the one loaded last by /update_weights_from_disk, as SGLang reports."""
        self.tokenizer_path = model_path
        self.tokenizer = tokenizer
        """Decodes responses into `text` and for `stop` strings; None: token ids only."""
        self.ignore_eos = ignore_eos
        self.weight_version = str(weight_version)
        self.app = web.Application(client_max_size=64 * 1024 * 1024,
                                   middlewares=[_log_call] if log_calls else [])
        self.app.add_routes([
            web.get("/health", self.health),
            web.get("/health_generate", self.health),
            web.get("/model_info", self.model_info),
            web.get("/get_model_info", self.model_info),  # SGLang's deprecated names, still served
            web.get("/server_info", self.server_info),
            web.get("/get_server_info", self.server_info),
            web.post("/generate", self.generate),
            web.put("/generate", self.generate),
            web.post("/abort_request", self.abort_request),
            web.post("/pause_generation", self.pause),
            web.post("/continue_generation", self.resume),
            web.post("/update_weights_from_disk", self.update_weights_from_disk),
            web.post("/init_weights_update_group", self.init_weights_update_group),
            web.post("/destroy_weights_update_group", self.destroy_weights_update_group),
            web.post("/begin_weight_update", self.begin_weight_update),
            web.post("/end_weight_update", self.end_weight_update),
            web.post("/update_weights_from_distributed", self.update_weights_from_distributed),
            web.route("*", "/release_memory_occupation", self.release_memory_occupation),
            web.route("*", "/resume_memory_occupation", self.resume_memory_occupation),
            web.route("*", "/flush_cache", self.flush_cache),
        ])
        self.app.on_startup.append(self._start_pump)
        self.app.on_cleanup.append(self._stop_pump)
        self._waiters: dict[str, asyncio.Queue] = {}
        """rid -> queue of engine events, for every request submitted and not yet finished."""
        self._failure: BaseException | None = None
        self._groups: dict[str, Any] = {}
        """group_name -> the process group joined by /init_weights_update_group."""
        self._update_session = False
        """Between /begin_weight_update and /end_weight_update (a distributed update needs one, as in
        SGLang 0.5.23)."""
        self._stopping = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pump: threading.Thread | None = None

    # -- the pump ---------------------------------------------------------------------------------

    async def _start_pump(self, app) -> None:
        self._loop = asyncio.get_running_loop()
        self._pump = threading.Thread(target=self._run_pump, name="rollpacker-serve-pump", daemon=True)
        self._pump.start()

    async def _stop_pump(self, app) -> None:
        self._stopping.set()
        if self._pump is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._pump.join, 5)

    def _run_pump(self) -> None:
        while not self._stopping.is_set():
            try:
                events = self.engine.poll(0.1)
            except BaseException as exc:  # the engine died: /health goes 503, waiters fail
                log.exception("engine poll failed")
                self._failure = exc
                self._loop.call_soon_threadsafe(self._fail_all)
                return
            for event in events:
                self._loop.call_soon_threadsafe(self._deliver, event)

    def _deliver(self, event: GenerationProgress | GenerationResult) -> None:
        queue = self._waiters.get(event.request_id)
        if queue is not None:
            queue.put_nowait(event)
        if isinstance(event, GenerationResult):
            self._waiters.pop(event.request_id, None)

    def _fail_all(self) -> None:
        for queue in self._waiters.values():
            queue.put_nowait(None)
        self._waiters.clear()

    # -- endpoints --------------------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self._failure is not None else 200)

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response({
            "model_path": self.model_path,
            "tokenizer_path": self.tokenizer_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.weight_version,
        })

    async def server_info(self, request: web.Request) -> web.Response:
        return web.json_response({
            "model_path": self.model_path,
            "max_running_requests": self.engine.capacity,
            "skip_tokenizer_init": True,
            "weight_version": self.weight_version,
            "version": "rollpacker-serve",
        })

    async def generate(self, request: web.Request) -> web.StreamResponse:
        if self._failure is not None:
            return error_reply(f"the engine failed: {self._failure!r}", 503)
        try:
            body = await request.json()
            gen, params = request_from_body(body)
            if gen.stop and self.tokenizer is None:
                raise BadRequest(f"sampling_params.stop needs a tokenizer: {self.model_path} has none")
            if gen.request_id in self._waiters:
                raise BadRequest(f"rid {gen.request_id!r} is already running")
            self.engine.submit([gen])
        except ValueError as exc:  # BadRequest, JSON errors, the engine's ConfigError/BackendMisuse
            return error_reply(str(exc))
        queue: asyncio.Queue = asyncio.Queue()
        self._waiters[gen.request_id] = queue
        started = time.monotonic()
        finish = lambda result: result_chunk(  # noqa: E731
            result, len(gen.prompt_ids), time.monotonic() - started, gen.max_new_tokens,
            **self._text(gen, params, result),
        )
        if not body.get("stream"):
            try:
                while True:
                    event = await queue.get()
                    if event is None:
                        return error_reply("the engine failed while generating", 500)
                    if isinstance(event, GenerationResult):
                        return web.json_response(finish(event))
            except asyncio.CancelledError:
                self._abort_quietly([gen.request_id])
                raise
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        try:
            await response.prepare(request)
            while True:
                event = await queue.get()
                if event is None:
                    await response.write(sse({"error": {"message": "the engine failed while generating"}}))
                    break
                if isinstance(event, GenerationResult):
                    await response.write(sse(finish(event)))
                    break
                await response.write(sse(progress_chunk(
                    gen.request_id, event.num_tokens, len(gen.prompt_ids), self.weight_version)))
            await response.write(sse(None))
            await response.write_eof()
        except ConnectionResetError:  # the client went away mid-stream: free the slot, log nothing
            self._abort_quietly([gen.request_id])
        except asyncio.CancelledError:  # the connection closed (handler cancellation)
            self._abort_quietly([gen.request_id])
            raise
        return response

    def _text(self, gen: GenerationRequest, params: dict, result: GenerationResult) -> dict:
        """The response's `text` (with a tokenizer) and what a "stop" matched, as SGLang reports them:
        a stop string ends the text before it, a stop token is left out of it (`no_stop_trim`: neither)."""
        if self.tokenizer is None:
            return {}
        skip = params.get("skip_special_tokens", True) is not False
        return stop_match(result, gen.stop, trim=not params.get("no_stop_trim"),
                          decode=lambda ids: self.tokenizer.decode(ids, skip_special_tokens=skip))

    def _abort_quietly(self, rids: list[str]) -> None:
        live = [r for r in rids if r in self._waiters]
        if live:
            try:
                self.engine.abort(live)
            except Exception:  # noqa: BLE001  (best effort on a disconnect)
                log.exception("abort after disconnect failed")

    async def abort_request(self, request: web.Request) -> web.Response:
        """SGLang semantics: `abort_all`, or every running rid that starts with `rid`; unknown rids
        are ignored (the request may have just finished)."""
        try:
            body = await request.json()
        except ValueError:
            return error_reply("the body must be JSON {rid, abort_all}")
        if not isinstance(body, dict):
            return error_reply("the body must be a JSON object {rid, abort_all}")
        rid = body.get("rid") or ""
        if body.get("abort_all"):
            targets = list(self._waiters)
        elif isinstance(rid, str) and rid:
            targets = [r for r in self._waiters if r.startswith(rid)]
        else:
            return error_reply("abort_request needs a rid or abort_all")
        if targets:
            self.engine.abort(targets)
        return web.Response(status=200)

    async def pause(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else {}
        mode = (body or {}).get("mode", "abort")
        if mode not in PAUSE_MODES:
            return error_reply(f"pause mode must be one of {PAUSE_MODES}, got {mode!r}")
        self.engine.pause()
        if mode == "abort" and self._waiters:
            self.engine.abort(list(self._waiters))
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def resume(self, request: web.Request) -> web.Response:
        self.engine.resume()
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def release_memory_occupation(self, request: web.Request) -> web.Response:
        """Free the engine's memory of `tags` (null: all) while nothing runs, as SGLang's does."""
        return await self._memory_call(request, "release_memory")

    async def resume_memory_occupation(self, request: web.Request) -> web.Response:
        return await self._memory_call(request, "resume_memory")

    async def _memory_call(self, request: web.Request, method: str) -> web.Response:
        from rollpacker.core.protocols import check_memory_tags

        call = getattr(self.engine, method, None)
        if call is None:
            return failed_reply(f"{type(self.engine).__name__} cannot release or resume its memory")
        try:
            body = await request.json() if request.can_read_body else {}
            tags = list(check_memory_tags((body or {}).get("tags")))
        except (ValueError, AttributeError) as exc:  # JSON errors, ConfigError naming the tag
            return error_reply(f"{request.path}: {exc}")
        if method == "release_memory" and self._waiters:
            return failed_reply(f"{request.path}: {len(self._waiters)} request(s) still running")
        log.info("%s tags=%s", request.path, tags)
        try:
            await asyncio.get_running_loop().run_in_executor(None, call, tags)
        except Exception as exc:  # noqa: BLE001  (reported to the caller, as SGLang does)
            return failed_reply(f"{request.path}: {exc}")
        return web.json_response({"success": True, "message": f"{request.path} {tags}: done"})

    async def flush_cache(self, request: web.Request) -> web.Response:
        if self._waiters:
            return web.Response(status=400, text="Cache not flushed: there are running or waiting requests.\n")
        return web.Response(status=200, text="Cache flushed.\n")


if web is not None:
    @web.middleware
    async def _log_call(request: web.Request, handler):
        """--log-calls: each call, logged when it arrives with the wall-clock time (its order against
        other processes' events, as the colocated-mode test reads it)."""
        log.info("call %s %s at=%.6f", request.method, request.path, time.time())
        return await handler(request)
