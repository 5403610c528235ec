"""SGLangEngine against two servers on 127.0.0.1 serving the tiny random Llama, once `rollpacker serve`
and once real SGLang (`sglang`-marked; skipped until `make sglang`): generate, stream, abort with partial
tokens, pause/continue, weight updates, the sampling parameters we send, two-server dispatch, an idle
server's CPU, and a server killed mid-round whose requests the core relaunches on the survivor (run last of
the session: it kills one of the servers the modules share)."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest
from processes import session_cpu_seconds
from sglang_helpers import collect, drive_one_step, request, wait_progress
import sglang_helpers

from rollpacker.backends.sglang.client import SGLangEngine
from rollpacker.backends.sglang.pool import DEFAULT_CAPACITY, running_limit
from rollpacker.core import Scheduler, make_policy
from rollpacker.core.protocols import GenerationProgress, GenerationRequest, RolloutEngine


kind, model, servers = sglang_helpers.kind, sglang_helpers.model, sglang_helpers.servers  # the server pair of each kind


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


@pytest.fixture
def engine(servers, model):
    eng = SGLangEngine(servers.urls[:1], expected_model=model, model_config_dir=model, stall_timeout_s=30)
    yield eng
    eng.close()


@pytest.mark.timeout(60)
def test_generate_streams_progress_and_matches_non_stream(engine, servers, kind):
    assert isinstance(engine, RolloutEngine)
    engine.submit([request(1, max_new=12), request(2, max_new=5)])
    results, progress = collect(engine, 2)
    r1, r2 = results["rp000000000001"], results["rp000000000002"]
    assert (r1.finish_reason, len(r1.token_ids), len(r1.logprobs)) == ("length", 12, 12)
    assert (r2.finish_reason, len(r2.token_ids)) == ("length", 5)
    assert all(lp <= 0.0 for lp in r1.logprobs)
    assert any(p.request_id == "rp000000000001" for p in progress)
    # Real SGLang (started with --enable-metrics) says when it ended each request; rollpacker serve does not.
    if kind == "sglang":
        assert all(0.0 <= r.way_back_s < 5.0 and 0.0 <= r.way_in_s < 5.0 for r in (r1, r2))
    else:
        assert all(r.way_back_s is None and r.way_in_s is None for r in (r1, r2))
    # The same greedy request, non-streamed, straight through the HTTP API.
    body = json.dumps({"rid": "plain", "input_ids": [1, 2, 3], "return_logprob": True,
                       "sampling_params": {"max_new_tokens": 12, "temperature": 0}})
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
    # the server now names the new weights' directory; reconnecting with the model's name still works
    assert get_json(engine.urls[0] + "/model_info")["model_path"] != model
    SGLangEngine(engine.urls, expected_model=model).close()
    engine.update_weights(original, version=3)  # restore (a directory this time)
    restored = greedy(13)
    assert restored.token_ids == before.token_ids and restored.weight_version == 3
    engine.flush_cache()  # idle now: allowed


@pytest.mark.timeout(120)
def test_the_sampling_params_we_send_take_effect(engine, kind):
    def run(*requests):
        engine.submit(list(requests))
        results, _ = collect(engine, len(requests), timeout_s=90)
        return [results[r.request_id] for r in requests]

    def sampled(i, **params):
        return GenerationRequest(f"rp{i:012d}", (1, 2, 3), max_new_tokens=8, **params)

    greedy, again = run(sampled(40, temperature=0.0), sampled(41, temperature=0.0))
    assert greedy.token_ids == again.token_ids
    # a cut that leaves only the most likely token is greedy, whatever the temperature
    top_k, top_p = run(sampled(42, temperature=1.0, top_k=1), sampled(43, temperature=1.0, top_p=1e-9))
    assert top_k.token_ids == top_p.token_ids == greedy.token_ids
    # a GRPO group: one prompt, distinct seeds, temperature 1: distinct answers
    group = run(*(sampled(44 + k, temperature=1.0, seed=1000 + k) for k in range(4)))
    assert len({r.token_ids for r in group}) == 4
    if kind == "rollpacker":  # SGLang applies sampling_seed only under --enable-deterministic-inference
        (same_seed,) = run(sampled(48, temperature=1.0, seed=1000))
        assert same_seed.token_ids == group[0].token_ids
    # stop_token_ids: the response ends at the first such token, kept, finish_reason "stop"
    (stopped,) = run(GenerationRequest("rp000000000049", (1, 2, 3), max_new_tokens=8, temperature=0.0,
                                       stop_token_ids=(greedy.token_ids[0],)))
    assert stopped.finish_reason == "stop" and stopped.token_ids == greedy.token_ids[:1]


@pytest.mark.timeout(120)
def test_length_replay_stops_every_request_at_its_trace_length(engine):
    """Through LengthReplay the server gets each request's trace length and ignore_eos (SGLang's sampling
    params): a sample ends at exactly its length, reported "stop" below the cap and "length" at it."""
    from rollpacker.backends.length_replay import LengthReplay
    from rollpacker.sim.workloads import load_workload

    cap = 40
    workload = load_workload("servegen-r1", num_prompts=3, seed=5, max_tokens=cap, scale_from=4096)
    expected = load_workload("servegen-r1", num_prompts=3, seed=5, max_tokens=cap, scale_from=4096)
    replay = LengthReplay(engine, workload, max_tokens=cap)
    requests = [GenerationRequest(f"rp{60 + i:012d}", (1, 2, 3 + i % 3), max_new_tokens=cap, temperature=1.0,
                                  seed=i, group=f"p{i % 3}") for i in range(9)]
    replay.submit(requests)
    results, _ = collect(replay, len(requests), timeout_s=90)
    targets = {r.request_id: expected.sample(int(r.group[1:]), 0) for r in requests}  # in submission order
    for rid, result in results.items():
        assert len(result.token_ids) == targets[rid], (rid, result.finish_reason)
        assert result.finish_reason == ("length" if targets[rid] == cap else "stop")
    assert len(set(targets.values())) > 2


@pytest.mark.timeout(60)
def test_two_servers_least_outstanding_dispatch(servers, model):
    with SGLangEngine(servers.urls, expected_model=model, stall_timeout_s=30) as eng:
        # the servers' own running-request limits (rollpacker serve: --capacity 8; SGLang started without
        # --max-running-requests: the limit it resolved, in /server_info's internal_states), not the default
        limits = [running_limit(get_json(url + "/server_info")) for url in servers.urls]
        assert eng.capacity == sum(limits) and None not in limits and eng.capacity != 2 * DEFAULT_CAPACITY
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


@pytest.mark.timeout(60)
def test_an_idle_server_takes_next_to_no_cpu(servers):
    """A server with nothing to run waits for work: on a CPU the cores it would spin on are the
    trainer's and the other servers' (SGLang's scheduler polls in a busy loop unless started with
    --sleep-on-idle, a whole core per server)."""
    sessions = [server.process.pid for server in servers.servers]  # each server runs in a session of its own
    time.sleep(1.0)  # the previous test's aborted requests are gone
    before = [session_cpu_seconds(s) for s in sessions]
    time.sleep(3.0)
    used = [round(session_cpu_seconds(s) - b, 2) for s, b in zip(sessions, before)]
    assert max(used) < 0.3, f"idle servers used {used} s of CPU in 3 s"


@pytest.mark.kills_a_shared_server
@pytest.mark.timeout(300)
def test_server_killed_mid_round_requests_are_relaunched_no_prompt_lost(servers, model):
    """Run last of the session (the marker): it kills the first of the shared servers."""
    victim = servers.servers[0]
    with SGLangEngine(servers.urls, expected_model=model, stall_timeout_s=30) as eng:
        prompts, samples = 3, 2
        sched = Scheduler(make_policy("sync", prompts=prompts, samples=samples, max_tokens=200), num_prompts=6)
        killed = []

        def kill_once(event) -> None:
            if not killed and isinstance(event, GenerationProgress) and event.num_tokens >= 4:
                victim.kill()  # SIGKILL: a crash, not a clean stop
                killed.append(event)

        out = drive_one_step(eng, sched, on_progress=kill_once, timeout_s=240)
        assert killed, "the server was never killed"
        assert [f for f in eng.server_failures if victim.url in str(f)], eng.server_failures
        assert eng.live_urls() == [servers.servers[1].url]
        (round_end,) = out["round_ends"]
        assert len(round_end.trained) == prompts  # every prompt of the step trained: none lost
        assert len(out["opt_steps"]) == 1
        assert len(out["launches"]) > prompts * samples  # the killed server's samples were relaunched
        assert round_end.report.retried_requests >= 1


def test_cpu_servers_split_the_cores_between_them(servers):
    """Each of the pair's processes runs with OMP_NUM_THREADS = cores // 2 (or what the environment set): two
    servers that each took every core were 4-13x slower decoding together than one alone on 2 cores."""
    import os

    from rollpacker.backends.sglang.launch import cpu_threads

    expected = os.environ.get("OMP_NUM_THREADS") or str(cpu_threads(2))
    for server in servers.servers:
        environ = dict(item.split("=", 1) for item in
                       open(f"/proc/{server.process.pid}/environ").read().split("\0") if "=" in item)
        assert environ.get("OMP_NUM_THREADS") == expected, server.url
    assert cpu_threads(2, cores=2) == 1 and cpu_threads(2, cores=16) == 8 and cpu_threads(4, cores=2) == 1
