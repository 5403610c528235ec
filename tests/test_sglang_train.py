"""reference/train.py --rollout sglang end to end against two servers on 127.0.0.1 serving the tiny
random Llama, once `rollpacker serve` and once real SGLang (`sglang`-marked; skipped until `make
sglang`): sync and tail, weights synced each step in buckets (gloo), every prompt trained once; the
servers' greedy tokens after the run equal those of the trainer's last checkpoint; Ctrl-C, then --resume
with a fresh weight-sync group (the servers still hold the killed trainer's)."""

from __future__ import annotations

import os
import signal

import pytest
from sglang_helpers import KINDS, collect, request, tiny_model, weight_versions
from test_faults import start_train, trained_keys, wait_for_saved_step
from test_reference_train import records, run_train

from rollpacker.backends.models import tiny_random_llama
from rollpacker.backends.sglang.client import SGLangEngine
from rollpacker.train.outputs import RunDir

NUM_NEW = 12


@pytest.fixture(scope="module")
def model() -> str:
    return tiny_model()


@pytest.fixture(scope="module", params=KINDS)
def kind(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def servers(kind, model, shared_servers):
    yield from shared_servers.module_pair(kind, model)


def train_args(model: str, servers, out, policy: str, steps: int) -> list:
    return ["--preset", "tiny_debug", "--model", model, "--out", out, "--steps", steps, "--policy", policy,
            "--max-tokens", 24, "--rollout", "sglang", "--sglang-urls", *servers.urls,
            "--weight-sync", "nccl", "--weight-sync-bucket-mb", "1"]


def servers_match_the_checkpoint(servers, model: str, checkpoint) -> None:
    """Greedy tokens of each server equal those of an embedded engine holding the checkpoint."""
    from safetensors.torch import load_file

    from rollpacker.backends.embedded.engine import EmbeddedEngine

    weights = {}
    for f in sorted(checkpoint.glob("*.safetensors")):
        weights.update(load_file(str(f)))
    with EmbeddedEngine(model, capacity=2, dtype="float32", stop_token_ids=()) as engine:
        engine.update_weights(weights, version=1)
        engine.submit([request(0, max_new=NUM_NEW)])
        want = collect(engine, 1)[0]["rp000000000000"].token_ids
    with SGLangEngine(servers.urls, expected_model=model) as engine:
        for k, url in enumerate(engine.urls):
            engine.submit([request(900 + k, max_new=NUM_NEW)], server=url)
        results, _ = collect(engine, len(engine.urls), timeout_s=120)
    assert [results[f"rp{900 + k:012d}"].token_ids for k in range(len(servers.urls))] == [want] * len(servers.urls)


@pytest.mark.timeout(300)
def test_a_server_serving_another_model_is_one_line_naming_both_and_no_weight_moves(servers, model, tmp_path):
    """--model with other shapes than the servers' model: refused before any weight moves (it used to crash
    the server on the first disk sync, or leave it partly overwritten with nccl); a checkpoint of the same
    shapes at another path is the same model (its weights replace the servers' at the first sync)."""
    other = tiny_random_llama(tmp_path / "other", hidden_size=32)
    same_shapes = tiny_random_llama(tmp_path / "ckpt", seed=1)
    before = weight_versions(servers)
    proc = run_train(*train_args(str(other), servers, tmp_path / "run", "sync", steps=1), check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert f"serves model {model!r}, not the expected {str(other)!r}: hidden_size 64 (expected 32)" in line, line
    assert weight_versions(servers) == before
    with SGLangEngine(servers.urls, expected_model=str(same_shapes)) as engine:  # accepted: the same shapes
        engine.submit([request(0, max_new=4)])
        assert len(collect(engine, 1)[0]["rp000000000000"].token_ids) == 4


@pytest.mark.timeout(900)
@pytest.mark.parametrize("policy", ["sync", "tail"])
def test_sync_and_tail_train_every_prompt_once_and_the_servers_hold_the_trainers_weights(servers, model, tmp_path,
                                                                                         policy, kind):
    out = tmp_path / policy
    run_train(*train_args(model, servers, out, policy, steps=2), timeout=800)
    rs = records(out)
    assert [r["step"] for r in rs] == [0, 1]
    assert len(trained_keys(out)) == len(set(trained_keys(out))) == 2 * 2, "a prompt was lost or trained twice"
    assert all(r["on_policy_fraction"] == 1.0 and r["weight_sync_buckets"] > 1 for r in rs)
    assert weight_versions(servers) == ["2", "2"]  # one sync after each step
    ways = [(back, way_in, reason) for r in rs
            for back, way_in, (_, _, reason, *_) in zip(r["ways_back"], r["ways_in"], r["requests"], strict=True)]
    assert len(ways) == sum(len(r["requests"]) for r in rs)
    if kind == "sglang":  # (started with --enable-metrics: each request's ways in and back, as the server timed them)
        assert all(0.0 <= back < 5.0 and 0.0 <= way_in < 5.0 for back, way_in, reason in ways if reason != "abort"), ways
    else:
        assert all(back is None and way_in is None for back, way_in, _ in ways)
    servers_match_the_checkpoint(servers, model, out / "checkpoints" / "step_2")


@pytest.mark.timeout(900)
def test_ctrl_c_then_resume_rejoins_the_running_servers_and_trains_every_prompt_once(servers, model, tmp_path):
    out = tmp_path / "run"
    proc = start_train(*train_args(model, servers, out, "tail", steps=3))
    wait_for_saved_step(out, 1, proc, timeout_s=500)  # SIGINT at once: steps 1 and 2 are still to train
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr[-3000:]
    assert RunDir(out).saved_step() >= 1
    run_train("--resume", out, timeout=800)  # a new weight group: the old one is still on the servers
    assert [r["step"] for r in records(out)] == [0, 1, 2]
    assert len(trained_keys(out)) == len(set(trained_keys(out))) == 3 * 2, "a prompt was lost or trained twice"
    assert weight_versions(servers) == ["3", "3"]
    servers_match_the_checkpoint(servers, model, out / "checkpoints" / "step_3")
