"""The fault suite of `rollpacker serve` on 127.0.0.1, with a client that really disconnects: an
abandoned request is aborted, ignore_eos honoured per server or per request, stop ids and strings and top_k honoured,
a sampling param it would not honour refused naming it, a busy port one line before loading.  The
trainer's faults are in test_faults.py."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from test_reference_train import ROOT

def _server(tmp_path_factory, extra_args):
    from rollpacker.backends.models import tiny_random_llama
    from rollpacker.backends.sglang.launch import launch_servers

    # a long context, so a 30000-token request runs far longer than the test waits for its abort
    model = tiny_random_llama(tmp_path_factory.mktemp("tiny32k"), max_position_embeddings=32768)
    return launch_servers(str(model), num_servers=1, kind="rollpacker", timeout_s=90, extra_args=extra_args)


@pytest.fixture(scope="module")
def ignore_eos_server(tmp_path_factory):
    with _server(tmp_path_factory, ["--ignore-eos", "--capacity", "2"]) as group:
        yield group


def _get_status(url: str) -> int:
    try:
        return urllib.request.urlopen(url, timeout=5).status
    except urllib.error.HTTPError as exc:
        return exc.code


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _post_then_disconnect(url: str, body: dict, after_s: float) -> None:
    """A client that sends /generate, waits, and closes its socket without reading the answer."""
    host, port = url.split("//")[1].rsplit(":", 1)
    data = json.dumps(body).encode()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (host.encode(), len(data), data))
        time.sleep(after_s)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("stream", [False, True])
def test_serve_aborts_a_request_whose_client_disconnects(ignore_eos_server, stream):
    url = ignore_eos_server.urls[0]
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 30000}, "stream": stream}
    _post_then_disconnect(url, body, after_s=1.0)
    deadline = time.time() + 10  # /flush_cache answers 400 while any request runs
    while _get_status(url + "/flush_cache") != 200:
        assert time.time() < deadline, "the request kept generating after its client left"
        time.sleep(0.2)
    server_log = ignore_eos_server.servers[0].log_tail(20000)
    assert "ERROR" not in server_log and "Traceback" not in server_log, server_log


@pytest.mark.timeout(200)
def test_serve_honours_ignore_eos_per_request_or_per_server(ignore_eos_server, tmp_path_factory):
    """--ignore-eos makes every request run to its length; without it, a request's own ignore_eos does (as
    SGLang's sampling param; what it changes in the engine: test_embedded_engine), and a value that is not a
    bool is a 400."""
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}}
    status, answer = _post(ignore_eos_server.urls[0] + "/generate", body)
    assert status == 200 and answer["meta_info"]["completion_tokens"] == 8
    with _server(tmp_path_factory, ["--capacity", "2"]) as plain:
        url = plain.urls[0] + "/generate"
        body["sampling_params"]["max_new_tokens"] = 200
        status, forced = _post(url, body)
        assert status == 200 and forced["meta_info"]["completion_tokens"] == 200, forced["meta_info"]
        status, refused = _post(url, {"input_ids": [1, 2], "sampling_params": {"ignore_eos": "yes"}})
    assert status == 400 and "ignore_eos" in refused["error"]["message"]


def _generate(url: str, max_new_tokens: int = 24, **params) -> dict:
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": max_new_tokens, **params}}
    status, answer = _post(url + "/generate", body)
    assert status == 200, answer
    return answer


@pytest.mark.timeout(200)
def test_serve_honours_stop_token_ids_stop_strings_and_top_k(ignore_eos_server):
    url = ignore_eos_server.urls[0]
    greedy = _generate(url, temperature=0.0)  # --ignore-eos: all 24 tokens
    ids, text = greedy["output_ids"], greedy["text"]
    assert len(ids) == 24 and greedy["meta_info"]["finish_reason"] == {"type": "length", "length": 24}

    stop_id = ids[12]
    cut = _generate(url, temperature=0.0, stop_token_ids=[stop_id])
    end = ids.index(stop_id) + 1
    assert cut["output_ids"] == ids[:end]  # ends early, with the stop token as its last token
    assert cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}

    stop = text[len(text) // 2 : len(text) // 2 + 3]
    cut = _generate(url, temperature=0.0, stop=[stop, "never-in-this-text"])
    assert cut["text"] == text[: text.find(stop)]  # the text ends before the stop string
    assert cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    n = cut["meta_info"]["completion_tokens"]
    assert n < 24 and cut["output_ids"] == ids[:n]

    sampled = _generate(url, temperature=1.0, sampling_seed=5)
    top1 = _generate(url, temperature=1.0, sampling_seed=5, top_k=1)
    assert top1["output_ids"] == ids != sampled["output_ids"]  # top_k=1 is greedy; without it, not
    assert _generate(url, temperature=1.0, sampling_seed=5, top_k=-1)["output_ids"] == sampled["output_ids"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("field,value", [
    ("min_new_tokens", 4), ("repetition_penalty", 1.3), ("frequency_penalty", 0.5), ("min_p", 0.1),
    ("stop_regex", "a+"), ("n", 2), ("top_k", 0), ("stop", 7), ("stop_token_ids", ["x"]), ("best_of", 2),
])
def test_serve_refuses_a_sampling_param_it_would_not_honour_naming_it(ignore_eos_server, field, value):
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4, field: value}}
    status, answer = _post(ignore_eos_server.urls[0] + "/generate", body)
    assert status == 400 and f"sampling_params.{field}" in answer["error"]["message"], answer
    # the value that turns it off (SGLang's default) is accepted
    off = {"min_new_tokens": 0, "repetition_penalty": 1.0, "frequency_penalty": 0.0, "min_p": 0.0, "n": 1}
    if field in off:
        assert _generate(ignore_eos_server.urls[0], 4, **{field: off[field]})["meta_info"]["completion_tokens"] == 4


@pytest.mark.timeout(120)
def test_serve_on_a_busy_port_is_one_line_before_loading(ignore_eos_server):
    port = ignore_eos_server.urls[0].rsplit(":", 1)[1]
    proc = subprocess.run([sys.executable, "-m", "rollpacker.cli", "serve", "--port", port], cwd=ROOT,
                          capture_output=True, text=True, timeout=100)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"--port {port}" in proc.stderr and "Loading weights" not in proc.stderr
