"""Bad input to the SGLang client: unreachable URL, an error answer, a model the server lacks, a
malformed answer.  Each gives an error naming the server, within bounded retries, never a hang.
The malformed and silent servers are small aiohttp apps in this process (loopback)."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web
from sglang_helpers import (SERVE_ARGS, LoopbackApp, answer_model_info, answer_ok, collect, fake_sglang, request,
                            tiny_model)

from rollpacker.backends.errors import BackendProtocolError, ServerRejected, ServerUnavailable
from rollpacker.backends.sglang.client import SGLangEngine
from rollpacker.backends.sglang.http import HttpConfig
from rollpacker.backends.sglang.launch import free_port, launch_servers, server_command

FAST = HttpConfig(connect_timeout_s=1.0, control_timeout_s=2.0, retries=2, backoff_s=0.05)


@pytest.fixture(scope="module")
def server():
    model = tiny_model()
    with launch_servers(model, num_servers=1, kind="rollpacker", extra_args=SERVE_ARGS, timeout_s=90) as group:
        yield group.urls[0], model


@pytest.mark.timeout(30)
def test_unreachable_url_fails_fast_naming_it():
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(ServerUnavailable, match=url):
        SGLangEngine([url], http=FAST, start_timeout_s=10)
    assert time.monotonic() - started < 5  # two attempts, no endless retrying


@pytest.mark.timeout(60)
def test_model_the_server_does_not_have(server):
    url, model = server
    with pytest.raises(ServerRejected, match=f"{url} serves model .*, not the expected 'other/model'"):
        SGLangEngine([url], expected_model="other/model", http=FAST)
    with SGLangEngine([url], expected_model=model, http=FAST) as eng:
        with pytest.raises(ServerRejected, match=f"{url}.*update_weights_from_disk"):
            eng.update_weights("/nonexistent/weights", version=1)
        eng.submit([request(1, max_new=3)])  # still serving, and unpaused after the failure
        results, _ = collect(eng, 1)
        assert results["rp000000000001"].finish_reason == "length"


@pytest.mark.timeout(60)
def test_server_answering_with_an_error(server):
    url, model = server
    with SGLangEngine([url], http=FAST) as eng:
        eng.submit([request(2, prompt=(1, 10**9))])  # a token id outside the vocabulary
        with pytest.raises(ServerRejected, match=f"server {url}: /generate rid=rp000000000002 answered HTTP 400"):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                eng.poll(0.2)
        results, _ = collect(eng, 1)  # the request still gets its one result
        assert results["rp000000000002"].finish_reason == "abort"


@pytest.mark.timeout(30)
def test_malformed_answers_name_the_server():
    async def bad_generate(request):
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b'data: {"output_ids": [1], "meta_info": {"completion_tokens": "many"}}\n\n')
        return resp

    async def not_json(request):
        return web.Response(text="<html>nginx</html>")

    app = fake_sglang(bad_generate)
    broken_info = LoopbackApp([web.get("/health", answer_ok), web.get("/get_model_info", not_json)])
    try:
        with pytest.raises(BackendProtocolError, match=f"server {broken_info.url}: /get_model_info answered non-JSON"):
            SGLangEngine([broken_info.url], http=FAST)
        with SGLangEngine([app.url], http=FAST, capacity_per_server=4) as eng:
            assert eng.capacity == 4
            eng.submit([request(3)])
            with pytest.raises(BackendProtocolError, match=f"server {app.url}: .*completion_tokens"):
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    eng.poll(0.2)
    finally:
        app.close()
        broken_info.close()


@pytest.mark.timeout(30)
def test_silent_server_never_hangs_poll_or_close():
    async def silent_generate(request):
        await asyncio.sleep(3600)

    app = fake_sglang(silent_generate)
    try:
        eng = SGLangEngine([app.url], http=FAST, stall_timeout_s=0.5)
        eng.submit([request(4)])
        for _ in range(3):
            started = time.monotonic()
            assert eng.poll(0.3) == []
            assert time.monotonic() - started < 5  # honours its 0.3 s, never the stream's silence
        started = time.monotonic()
        eng.close()
        assert time.monotonic() - started < 15
    finally:
        app.close()


@pytest.mark.timeout(30)
def test_all_servers_dead_raises_naming_them(server):
    group_url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ServerUnavailable, match=group_url):
        SGLangEngine([server[0], group_url], http=FAST)  # one bad URL fails the whole attach


def test_launched_sglang_streams_only_new_tokens_unless_told_otherwise():
    cmd = server_command("sglang", "m", "127.0.0.1", 1, 1, ())
    assert "--incremental-streaming-output" in cmd and cmd[cmd.index("--stream-interval") + 1] == "16"
    mine = server_command("sglang", "m", "127.0.0.1", 1, 1, ("--stream-interval=1",))
    assert "--stream-interval" not in mine and mine[-1] == "--stream-interval=1"
    assert "--incremental-streaming-output" not in server_command("rollpacker", "m", "127.0.0.1", 1, 1, ())


def test_launched_sglang_on_a_cpu_gets_the_cpu_flags_unless_told_otherwise():
    def value(cmd, flag):
        return cmd[cmd.index(flag) + 1]

    cpu = server_command("sglang", "m", "127.0.0.1", 1, 1, ("--dtype", "bfloat16"), python="/venv/python", cpu=True)
    assert cpu[0] == "/venv/python"
    assert (value(cpu, "--device"), value(cpu, "--attention-backend")) == ("cpu", "torch_native")
    assert value(cpu, "--cuda-graph-backend-decode") == value(cpu, "--cuda-graph-backend-prefill") == "disabled"
    assert value(cpu, "--max-total-tokens") == "32768" and value(cpu, "--dtype") == "bfloat16"  # the caller's
    assert cpu.count("--dtype") == 1 and "--sleep-on-idle" in cpu  # an idle scheduler would spin on a core
    gpu = server_command("sglang", "m", "127.0.0.1", 1, 1, (), cpu=False)
    assert "--device" not in gpu and "--attention-backend" not in gpu and "--sleep-on-idle" not in gpu


@pytest.mark.timeout(30)
def test_a_server_that_streams_cumulatively_is_named_in_a_warning(caplog):
    async def settings(request):
        return web.json_response({"incremental_streaming_output": False, "max_running_requests": 7})

    app = LoopbackApp([web.get("/health", answer_ok), web.get("/get_model_info", answer_model_info),
                       web.get("/get_server_info", settings)])
    try:
        with caplog.at_level("WARNING"), SGLangEngine([app.url], http=FAST) as eng:
            assert eng.capacity == 7
        assert any(app.url in r.getMessage() and "--incremental-streaming-output" in r.getMessage()
                   for r in caplog.records)
    finally:
        app.close()
