"""SGLangEngine against `rollpacker serve` subprocesses on 127.0.0.1 with the tiny random Llama:
generate, stream, abort with partial tokens, pause/continue, weight updates, two-server dispatch,
and a server killed mid-round whose requests the core relaunches on the survivor."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest
from sglang_helpers import collect, drive_one_step, request, tiny_model, two_servers, wait_progress

from rollpacker.backends.sglang.client import SGLangEngine
from rollpacker.core import Scheduler, make_policy
from rollpacker.core.protocols import GenerationProgress, RolloutEngine


@pytest.fixture(scope="module")
def model() -> str:
    return tiny_model()


@pytest.fixture(scope="module")
def servers(model):
    with two_servers(model) as group:
        yield group


@pytest.fixture
def engine(servers, model):
    eng = SGLangEngine(servers.urls[:1], expected_model=model, stall_timeout_s=5)
    yield eng
    eng.close()


@pytest.mark.timeout(60)
def test_generate_streams_progress_and_matches_non_stream(engine, servers):
    assert isinstance(engine, RolloutEngine)
    engine.submit([request(1, max_new=12), request(2, max_new=5)])
    results, progress = collect(engine, 2)
    r1, r2 = results["rp000000000001"], results["rp000000000002"]
    assert (r1.finish_reason, len(r1.token_ids), len(r1.logprobs)) == ("length", 12, 12)
    assert (r2.finish_reason, len(r2.token_ids)) == ("length", 5)
    assert all(lp <= 0.0 for lp in r1.logprobs)
    assert any(p.request_id == "rp000000000001" for p in progress)
    # The same greedy request, non-streamed, straight through the HTTP API.
    body = json.dumps({"rid": "plain", "input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 12, "temperature": 0}})
    req = urllib.request.Request(servers.urls[0] + "/generate", body.encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        out = json.loads(resp.read())
    assert out["output_ids"] == list(r1.token_ids)
    assert out["meta_info"]["finish_reason"]["type"] == "length"
    assert [p[1] for p in out["meta_info"]["output_token_logprobs"]] == list(r1.token_ids)


@pytest.mark.timeout(60)
def test_abort_mid_generation_returns_partial_tokens(engine):
    engine.submit([request(3, max_new=1500)])
    wait_progress(engine, "rp000000000003", min_tokens=4)
    engine.abort(["rp000000000003"])
    results, _ = collect(engine, 1)
    r = results["rp000000000003"]
    assert r.finish_reason == "abort"
    assert 4 <= len(r.token_ids) < 1500 and len(r.logprobs) == len(r.token_ids)
    engine.abort(["rp000000000003"])  # aborting a finished request is a harmless race
    assert engine.poll(0.2) == []


@pytest.mark.timeout(60)
def test_pause_holds_requests_and_continue_finishes_them(engine):
    engine.submit([request(4, max_new=300)])
    wait_progress(engine, "rp000000000004", min_tokens=2)
    engine.pause()
    time.sleep(0.3)
    engine.poll(0.1)  # drain what was decoded before the pause took effect
    stalled = engine.poll(0.8)
    assert not any(isinstance(e, GenerationProgress) for e in stalled), "tokens generated while paused"
    engine.resume()
    results, _ = collect(engine, 1)
    assert results["rp000000000004"].finish_reason == "length"
    assert len(results["rp000000000004"].token_ids) == 300


@pytest.mark.timeout(90)
def test_weight_update_changes_outputs_deterministically(engine, model, tmp_path):
    from safetensors.torch import load_file

    original = {}
    for f in sorted(Path(model).glob("*.safetensors")):
        original.update(load_file(str(f)))
    name = next(n for n in original if n.endswith("norm.weight") and "layers" not in n)
    perturbed = dict(original)
    perturbed[name] = -3.0 * original[name]

    def greedy(i: int):
        engine.submit([request(i, max_new=10)])
        results, _ = collect(engine, 1)
        return results[f"rp{i:012d}"]

    before = greedy(10)
    engine.update_weights(perturbed, version=1)
    after = greedy(11)
    assert after.token_ids != before.token_ids and after.weight_version == 1
    engine.update_weights(perturbed, version=2)
    assert greedy(12).token_ids == after.token_ids  # the same weights give the same tokens
    engine.update_weights(original, version=3)  # restore (a directory this time)
    restored = greedy(13)
    assert restored.token_ids == before.token_ids and restored.weight_version == 3
    engine.flush_cache()  # idle now: allowed


@pytest.mark.timeout(60)
def test_two_servers_least_outstanding_dispatch(servers, model):
    with SGLangEngine(servers.urls, expected_model=model, stall_timeout_s=5) as eng:
        assert eng.capacity == 16  # 8 per server, from /get_server_info
        eng.submit([request(20 + i, max_new=1500) for i in range(6)])
        deadline = time.monotonic() + 10
        while sum(eng.outstanding().values()) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(eng.outstanding().values()) == [3, 3]
        eng.abort([f"rp{20 + i:012d}" for i in range(2)])  # both go to the first server
        collect(eng, 2)
        eng.submit([request(30, max_new=1500), request(31, max_new=1500)])  # so these go there too
        deadline = time.monotonic() + 10
        while sum(eng.outstanding().values()) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert eng.outstanding() == dict.fromkeys(servers.urls, 3)
        eng.abort([f"rp{i:012d}" for i in [22, 23, 24, 25, 30, 31]])
        results, _ = collect(eng, 6)
        assert all(r.finish_reason == "abort" for r in results.values())


@pytest.mark.timeout(120)
def test_server_killed_mid_round_requests_are_relaunched_no_prompt_lost(model):
    group = two_servers(model)
    try:
        victim = group.servers[0]
        with SGLangEngine(group.urls, expected_model=model, stall_timeout_s=5) as eng:
            prompts, samples = 3, 2
            sched = Scheduler(make_policy("sync", prompts=prompts, samples=samples, max_tokens=200), num_prompts=6)
            killed = []

            def kill_once(event) -> None:
                if not killed and isinstance(event, GenerationProgress) and event.num_tokens >= 4:
                    victim.kill()  # SIGKILL: a crash, not a clean stop
                    killed.append(event)

            out = drive_one_step(eng, sched, on_progress=kill_once)
            assert killed, "the server was never killed"
            assert [f for f in eng.server_failures if victim.url in str(f)], eng.server_failures
            assert eng.live_urls() == [group.servers[1].url]
            (round_end,) = out["round_ends"]
            assert len(round_end.trained) == prompts  # every prompt of the step trained: none lost
            assert len(out["opt_steps"]) == 1
            assert len(out["launches"]) > prompts * samples  # the killed server's samples were relaunched
            assert round_end.report.retried_requests >= 1
    finally:
        group.stop()
