"""The backend error family: every backend failure is a `BackendError`, and foreign exceptions
(aiohttp, JSON and text decoding, a dead reward dispatcher) are translated where a backend crosses
its I/O boundary, naming what failed.  The servers here are real loopback sockets and aiohttp apps
answering what no SGLang server would; the reward executor runs real worker processes."""

from __future__ import annotations

import asyncio
import os
import resource
import socket
import threading
import time

import aiohttp
import pytest
from aiohttp import web
from sglang_helpers import LoopbackApp, answer_ok, fake_sglang, request

from rollpacker.backends import errors
from rollpacker.backends.errors import (
    BackendError,
    BackendMisuse,
    BackendProtocolError,
    EngineFailed,
    GraphCaptureFailed,
    InvalidMicroBatch,
    RewardExecutorFailed,
    SGLangError,
    ServerRejected,
    ServerUnavailable,
    TrainerFailed,
)
from rollpacker.backends.rewards.pool import ProcessRewardExecutor
from rollpacker.backends.sglang.client import SGLangEngine
from rollpacker.backends.sglang.codec import result_chunk, sse
from rollpacker.backends.sglang.http import HttpConfig
from rollpacker.backends.sglang.pool import MAX_STREAM_LINE
from rollpacker.backends.sglang.launch import free_port
from rollpacker.core.errors import ConfigError, RollpackerError, SchedulerMisuse
from rollpacker.core.protocols import GenerationResult, RewardJob

FAST = HttpConfig(connect_timeout_s=1.0, control_timeout_s=2.0, retries=2, backoff_s=0.05)
FAMILY = (SGLangError, ServerUnavailable, ServerRejected, BackendProtocolError, EngineFailed,
          GraphCaptureFailed, RewardExecutorFailed, InvalidMicroBatch, BackendMisuse, TrainerFailed)


def test_every_backend_error_is_one_family():
    assert sorted(errors.__all__) == sorted(["BackendError", *(c.__name__ for c in FAMILY)])
    for cls in FAMILY:
        assert issubclass(cls, BackendError) and issubclass(cls, RollpackerError), cls
    assert issubclass(InvalidMicroBatch, ValueError) and issubclass(BackendMisuse, ValueError)
    assert all(issubclass(c, SGLangError) for c in (ServerUnavailable, ServerRejected, BackendProtocolError))
    assert not issubclass(ConfigError, BackendError) and not issubclass(SchedulerMisuse, BackendError)


def first_results(engine, timeout_s: float = 30.0) -> list[GenerationResult]:
    """Poll `engine` until results come (at most `timeout_s`); the results of that poll."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        results = [r for r in engine.poll(0.2) if isinstance(r, GenerationResult)]
        if results:
            return results
    return []


THREE_TOKENS = sse(result_chunk(GenerationResult("rp000000000007", (5, 6, 7), (-0.5,) * 3, "stop", 3, 0.0),
                                prompt_tokens=3, latency_s=1.0, max_new_tokens=8))
"""The final chunk of request 7's three-token answer."""


async def silent_stream(request):
    """A /generate that opens its stream and then says nothing (the test ends it)."""
    resp = web.StreamResponse()
    await resp.prepare(request)
    await asyncio.sleep(3600)
    return resp


class _RawServer:
    """A loopback TCP server that answers every connection with `payload` and hangs up."""

    def __init__(self, payload: bytes) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._payload = payload
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(self._payload)

    def close(self) -> None:
        self._sock.close()


@pytest.mark.timeout(30)
def test_unreachable_server_is_a_backend_error_naming_it():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(BackendError, match=url) as info:
        SGLangEngine([url], http=FAST, start_timeout_s=10)
    assert isinstance(info.value, ServerUnavailable)


@pytest.mark.timeout(30)
def test_an_answer_that_is_not_http_is_a_protocol_error_naming_the_server():
    garbage = _RawServer(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
    try:
        with pytest.raises(BackendError, match=f"server {garbage.url}: /health answered something that is not HTTP") as info:
            SGLangEngine([garbage.url], http=FAST, start_timeout_s=10)
        assert isinstance(info.value, BackendProtocolError)
        assert isinstance(info.value.__cause__, aiohttp.ClientResponseError)  # translated, cause kept
    finally:
        garbage.close()


@pytest.mark.timeout(30)
def test_an_answer_that_is_not_utf8_is_a_protocol_error_naming_the_server():
    body = b"\xff\xfe{\x80}"
    latin = _RawServer(b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\n"
                       b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
    try:
        with pytest.raises(BackendProtocolError, match=f"server {latin.url}: /model_info answered non-JSON"):
            SGLangEngine([latin.url], http=FAST, start_timeout_s=10)
    finally:
        latin.close()


@pytest.mark.timeout(60)
def test_sglang_engine_misuse_is_a_backend_error_not_scheduler_misuse():
    """A duplicate running id, an abort of an id never sent, a closed engine: the engine's misuse
    (BackendMisuse), not an event the core's state machines refused (SchedulerMisuse)."""

    app = fake_sglang(silent_stream)
    try:
        eng = SGLangEngine([app.url], http=FAST, capacity_per_server=4, stall_timeout_s=60)
        eng.submit([request(1)])
        errors_seen = []
        for call in (lambda: eng.submit([request(1)]), lambda: eng.abort(["rp000000000099"])):
            with pytest.raises(BackendMisuse) as info:
                call()
            errors_seen.append(info.value)
        eng.abort(["rp000000000001"])
        eng.close()
        with pytest.raises(BackendMisuse, match="closed") as info:
            eng.submit([request(2)])
        errors_seen.append(info.value)
        assert not any(isinstance(e, SchedulerMisuse) for e in errors_seen)
        assert "rp000000000001" in str(errors_seen[0]) and "rp000000000099" in str(errors_seen[1])
    finally:
        app.close()


@pytest.mark.timeout(60)
def test_a_32k_token_response_streamed_cumulatively_is_read_whole():
    """SGLang's default stream repeats every output id and log-prob in each line: a 40k-token
    response is a 1.3 MB line, past aiohttp's default line limit; it must come back whole."""
    n = 40_000
    final = result_chunk(GenerationResult("rp000000000007", tuple(range(n)), (-0.25,) * n, "length", 3, 0.0),
                         prompt_tokens=3, latency_s=1.0, max_new_tokens=n)

    async def long_answer(request):
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(sse(final) + sse(None))
        return resp

    app = fake_sglang(long_answer)
    assert len(sse(final)) > 1_000_000
    try:
        with SGLangEngine([app.url], http=FAST, capacity_per_server=4, stall_timeout_s=5) as eng:
            eng.submit([request(7)])
            results = first_results(eng)
        assert len(results) == 1 and results[0].finish_reason == "length"
        assert results[0].token_ids == tuple(range(n)) and results[0].logprobs == (-0.25,) * n
    finally:
        app.close()


@pytest.mark.timeout(60)
def test_a_line_that_arrives_slower_than_the_stall_timeout_is_read_whole():
    """Half a line, then silence past the stall timeout, then the rest: the stall only checks the
    server's health; the half already read is kept (a cancelled readline used to drop it, and the
    rest of the line was then a malformed chunk)."""
    final = THREE_TOKENS

    async def slow_line(request):
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(final[:len(final) // 2])
        await asyncio.sleep(1.5)  # three stall timeouts
        await resp.write(final[len(final) // 2:] + sse(None))
        return resp

    app = fake_sglang(slow_line)
    try:
        with SGLangEngine([app.url], http=FAST, capacity_per_server=4, stall_timeout_s=0.5) as eng:
            eng.submit([request(7)])
            results = first_results(eng)
            assert len(results) == 1 and results[0].finish_reason == "stop"
            assert results[0].token_ids == (5, 6, 7)
    finally:
        app.close()


@pytest.mark.timeout(120)
def test_a_stream_line_past_the_line_limit_is_raised_by_poll_not_lost():
    """However slowly the machine reads the 64 MiB, the stall timeout (short on purpose) only checks
    the server's health: the verdict is the line limit, not the clock."""
    async def endless_line(request):
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b"data: " + b"7" * (MAX_STREAM_LINE + 1024))  # no newline: a broken server
        await asyncio.sleep(3600)
        return resp

    app = fake_sglang(endless_line)
    try:
        with SGLangEngine([app.url], http=FAST, capacity_per_server=4, stall_timeout_s=0.5) as eng:
            eng.submit([request(7)])
            with pytest.raises(BackendError, match=f"server {app.url}: /generate rid=rp000000000007 sent an unreadable"):
                deadline = time.monotonic() + 90
                while time.monotonic() < deadline:
                    eng.poll(0.2)
            results = eng.poll(1.0)  # its one result still comes, as an abort
            assert [r.finish_reason for r in results if hasattr(r, "finish_reason")] == ["abort"]
    finally:
        app.close()


@pytest.mark.timeout(90)
def test_running_out_of_file_descriptors_is_one_error_naming_the_limit_not_silent_aborts():
    """Each streamed request holds a socket.  The engine raises the soft open-file limit to the
    hard one at start; past it, the next poll says so, naming RLIMIT_NOFILE, instead of the
    requests coming back as aborts nobody asked for."""
    app = fake_sglang(silent_stream)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
        with SGLangEngine([app.url], http=FAST, capacity_per_server=64, stall_timeout_s=30) as eng:
            assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard, "raised to the hard limit at start"
            resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, hard))
            eng.submit([request(i) for i in range(40)])
            aborted = []
            with pytest.raises(SGLangError, match=r"open-file limit \(RLIMIT_NOFILE soft \d+, hard") as info:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    aborted += [r for r in eng.poll(0.2) if isinstance(r, GenerationResult)]
            assert "requests in flight" in str(info.value) and "ulimit -n" in str(info.value)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        app.close()


@pytest.mark.timeout(60)
def test_a_generate_whose_connection_cannot_open_yet_is_tried_again_not_aborted():
    """A /generate whose connection could not be opened never reached the server (it restarts, or
    its accept backlog overflowed in a connect storm): it is tried again with backoff, not returned
    as an abort nobody asked for."""
    final = THREE_TOKENS

    async def three_tokens(request):
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(final + sse(None))
        return resp

    app = fake_sglang(three_tokens)
    patient = HttpConfig(connect_timeout_s=2.0, control_timeout_s=5.0, retries=6, backoff_s=0.2)
    try:
        with SGLangEngine([app.url], http=patient, capacity_per_server=4, stall_timeout_s=30) as eng:
            app.close()  # nothing listens on its port for a while: connections are refused
            time.sleep(0.3)
            eng.submit([request(7)])
            time.sleep(0.5)
            app = fake_sglang(three_tokens, port=app.port)
            results = first_results(eng)
        assert [(r.finish_reason, r.token_ids) for r in results] == [("stop", (5, 6, 7))]
    finally:
        app.close()


def hang(task, entry, response):
    time.sleep(3600)


@pytest.mark.timeout(90)
def test_reward_dispatcher_that_cannot_replace_a_worker_fails_loudly():
    """A worker killed at its deadline needs a replacement; with no file descriptor left for its
    pipe the dispatcher dies, and submit/poll say so instead of waiting forever.  (The soft limit is
    3, so no descriptor can open above stdin, stdout and stderr, and the dispatcher's poll of its 2 stays
    legal: a limit of "the number open now" failed once in a full `make test`, where something else in the
    process closed descriptors and the replacement started.)"""
    executor = ProcessRewardExecutor(1, scorer=hang, warmup=None)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        executor.submit(RewardJob("rp000000000001", "t", None, "r", deadline_s=0.5))
        resource.setrlimit(resource.RLIMIT_NOFILE, (3, hard))
        outcomes, deadline = [], time.monotonic() + 60
        with pytest.raises(RewardExecutorFailed, match="dispatcher thread died") as info:
            while time.monotonic() < deadline:
                outcomes += executor.poll(0.5)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert isinstance(info.value, BackendError)
        assert "could not start a reward worker process" in str(info.value.__cause__)
        assert [(o.request_id, o.status) for o in outcomes] == [("rp000000000001", "timeout")]
        with pytest.raises(RewardExecutorFailed):
            executor.submit(RewardJob("rp000000000002", "t", None, "r", deadline_s=0.5))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        executor.close()


@pytest.mark.timeout(90)
def test_reward_dispatcher_whose_shutdown_fails_too_still_says_so():
    """With no descriptor at all (soft limit 0) the dispatcher's own wait fails, and so does stopping its
    worker: poll raises, naming the first cause, instead of returning nothing forever."""
    executor = ProcessRewardExecutor(1, scorer=hang, warmup=None)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        executor.submit(RewardJob("rp000000000001", "t", None, "r", deadline_s=0.5))
        resource.setrlimit(resource.RLIMIT_NOFILE, (0, hard))
        deadline = time.monotonic() + 60
        with pytest.raises(RewardExecutorFailed, match="dispatcher thread died") as info:
            while time.monotonic() < deadline:
                executor.poll(0.5)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert isinstance(info.value.__cause__, OSError)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        executor.close()
