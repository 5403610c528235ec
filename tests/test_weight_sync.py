"""Weight sync from a trainer to two servers on 127.0.0.1 serving the tiny random Llama, once `rollpacker
serve` and once real SGLang (`sglang`-marked; skipped until `make sglang`): SGLang's distributed path
(/init_weights_update_group once, then /update_weights_from_distributed per bucket inside a
/begin_weight_update ... /end_weight_update session) over gloo, from one trainer process and from two
under torchrun (FSDP2); a trainer restarted after a kill (a fresh group; a reused name refused in one
line, not after the timeout); the disk path into a named directory; the bucketing; the endpoints' bad
input.

After a sync both servers must produce the greedy tokens of an in-process embedded engine loaded
with the trainer's exported weights (the same engine code: exact), and not the tokens of before.
Bytes moved and seconds per GB are printed (run with -s)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sglang_helpers import collect, request
import sglang_helpers

torch = pytest.importorskip("torch")

from rollpacker.backends.sglang.client import SGLangEngine  # noqa: E402
from rollpacker.backends.sglang.weights import buckets  # noqa: E402
from rollpacker.driver import sync_weights  # noqa: E402

kind, model, servers = sglang_helpers.kind, sglang_helpers.model, sglang_helpers.servers  # the server pair of each kind


SCRIPT = Path(__file__).with_name("weight_sync_ranks.py")
KILLED_TRAINER = Path(__file__).with_name("weight_sync_trainer.py")
REPO = SCRIPT.parent.parent
BUCKET = 256 * 1024  # small, so the tiny model goes in several buckets
NUM_NEW = 12


def greedy_per_server(engine: SGLangEngine, first_id: int) -> list[tuple[int, ...]]:
    """The greedy tokens of the same prompt on each server, in URL order."""
    for k, url in enumerate(engine.urls):
        engine.submit([request(first_id + k, max_new=NUM_NEW)], server=url)
    results, _ = collect(engine, len(engine.urls), timeout_s=120)
    return [results[f"rp{first_id + k:012d}"].token_ids for k in range(len(engine.urls))]


def reference_greedy(model: str, weights: dict) -> tuple[int, ...]:
    """The same request on an in-process embedded engine holding `weights`."""
    from rollpacker.backends.embedded.engine import EmbeddedEngine

    with EmbeddedEngine(model, capacity=2, dtype="float32", stop_token_ids=()) as engine:
        engine.update_weights(weights, version=1)
        engine.submit([request(0, max_new=NUM_NEW)])
        results, _ = collect(engine, 1)
    return results["rp000000000000"].token_ids


def perturbed_trainer(model: str, seed: int):
    from rollpacker.backends.trainer.pytorch import TorchTrainer, TorchTrainerConfig

    trainer = TorchTrainer(TorchTrainerConfig(model_dir=model, device="cpu", dtype="float32"))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=generator))
    return trainer


@pytest.mark.timeout(300)
def test_distributed_sync_in_buckets_gives_both_servers_the_trainers_tokens(servers, model):
    trainer = perturbed_trainer(model, seed=1)
    expected = trainer.export_weights()
    with SGLangEngine(servers.urls, expected_model=model) as engine:
        before = greedy_per_server(engine, 100)
        engine.use_distributed_sync(backend="gloo", bucket_bytes=BUCKET, group_name="single")
        sync_weights(engine, trainer, version=1)
        stats = engine.last_sync
        after = greedy_per_server(engine, 110)
        want = reference_greedy(model, expected)
        assert after == [want, want] and before[0] != want
        assert engine.weight_version == 1
        assert stats.num_tensors == len(expected)
        assert stats.num_bytes == sum(t.numel() * t.element_size() for t in expected.values())
        assert stats.num_buckets > 2  # bucketed, not one call
        print(f"\ndistributed sync (gloo, 1 trainer process, 2 servers): {stats.num_bytes / 1e6:.1f} MB "
              f"per server in {stats.num_buckets} buckets, {stats.seconds:.2f} s, {stats.s_per_gb:.1f} s/GB")

        # a second sync reuses the group (init once) and lands again
        trainer2 = perturbed_trainer(model, seed=2)
        sync_weights(engine, trainer2, version=2)
        assert greedy_per_server(engine, 120) == [reference_greedy(model, trainer2.export_weights())] * 2


@pytest.mark.timeout(300)
def test_disk_sync_writes_to_the_named_directory_and_both_servers_load_it(servers, model, tmp_path):
    trainer = perturbed_trainer(model, seed=3)
    shared = tmp_path / "shared"
    with SGLangEngine(servers.urls, expected_model=model, weights_dir=shared, model_config_dir=model) as engine:
        sync_weights(engine, trainer, version=5)
        written = list(shared.glob("*/model.safetensors"))
        assert len(written) == 1 and (written[0].parent / "config.json").is_file()
        assert greedy_per_server(engine, 200) == [reference_greedy(model, trainer.export_weights())] * 2
        assert engine.weight_version == 5 and engine.last_sync is None


@pytest.mark.timeout(400)
def test_two_trainer_ranks_under_torchrun_rank0_sends_and_the_other_drains(servers, model, tmp_path):
    """FSDP2 over two gloo ranks: each parameter gathered on both, sent by rank 0 only; rank 1 waits
    for the next command (no deadlock), then both export for the reference."""
    out = tmp_path / "ranks.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", str(SCRIPT),
           "--model", model, "--out", str(out), "--bucket-bytes", str(BUCKET), "--urls", *servers.urls]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # its own group: a hang kills the ranks too, not torchrun alone
    try:
        output, _ = proc.communicate(timeout=360)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise AssertionError(f"the ranks did not finish in 360 s:\n{output[-6000:]}") from None
    assert proc.returncode == 0, output[-6000:]
    r = json.loads(out.read_text())
    with SGLangEngine(servers.urls, expected_model=model) as engine:
        after = greedy_per_server(engine, 300)
    want = reference_greedy(model, torch.load(r["expected"]))
    assert after == [want, want] and r["before"][0] != list(want)
    assert r["num_buckets"] > 2 and r["num_bytes"] > 0
    print(f"\ndistributed sync (gloo, 2 FSDP2 ranks, 2 servers): {r['num_bytes'] / 1e6:.1f} MB per server in "
          f"{r['num_buckets']} buckets, {r['seconds']:.2f} s, {r['s_per_gb']:.1f} s/GB")


def _post(url: str, path: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def start_trainer_then_kill_it(servers, model: str, group: str | None) -> str:
    """A trainer process joins a weight group (`group`, or its own new name), syncs, and is killed with
    SIGKILL: the servers keep the group.  Returns the group's name."""
    proc = subprocess.Popen([sys.executable, str(KILLED_TRAINER), "--model", model, "--urls", *servers.urls,
                             *(["--group", group] if group else [])], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("SYNCED "):
                return line.split()[1]
        raise AssertionError("the trainer exited before it synced:\n" + "".join(lines[-40:]))
    finally:
        proc.kill()
        proc.wait(30)


@pytest.mark.timeout(400)
def test_a_trainer_restarted_after_a_kill_joins_a_fresh_group_and_a_reused_name_is_refused_at_once(servers, model):
    import time

    from rollpacker.backends.errors import ServerRejected

    held = start_trainer_then_kill_it(servers, model, group="fixed-name")
    with SGLangEngine(servers.urls, expected_model=model) as engine:
        engine.use_distributed_sync(backend="gloo", bucket_bytes=BUCKET, group_name=held)
        started = time.monotonic()
        with pytest.raises(ServerRejected, match="fixed-name"):
            sync_weights(engine, perturbed_trainer(model, seed=4), version=1)
        assert time.monotonic() - started < 120  # one line now, not after the 600 s timeout
    # the default: a new name per trainer start, so the restart simply joins; close() leaves it
    orphan = start_trainer_then_kill_it(servers, model, group=None)
    trainer = perturbed_trainer(model, seed=5)
    with SGLangEngine(servers.urls, expected_model=model) as engine:
        engine.use_distributed_sync(backend="gloo", bucket_bytes=BUCKET)
        sync_weights(engine, trainer, version=2)
        joined = engine._distributed.group_name
        assert joined != orphan
        assert greedy_per_server(engine, 500) == [reference_greedy(model, trainer.export_weights())] * 2
    status, body = _post(servers.urls[0], "/destroy_weights_update_group", {"group_name": joined})
    assert status == 400 and body["success"] is False  # close() destroyed it already


@pytest.mark.timeout(60)
def test_distributed_endpoints_refuse_bad_input_naming_it(servers, kind):
    if kind != "rollpacker":
        pytest.skip("rollpacker serve's own messages")
    url = servers.urls[0]
    status, body = _post(url, "/update_weights_from_distributed",
                         {"names": ["x"], "dtypes": ["float32"], "shapes": [[1]], "group_name": "never-joined"})
    assert status == 400 and "never-joined" in body["error"]["message"]
    status, body = _post(url, "/init_weights_update_group", {"master_address": "127.0.0.1", "master_port": 1,
                                                              "rank_offset": 1, "world_size": 2, "backend": "nccl"})
    assert status == 400 and body["success"] is False and "nccl" in body["message"]
    status, body = _post(url, "/init_weights_update_group", {"master_port": 1})
    assert status == 400 and "master_address" in body["error"]["message"]


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 40), max_size=30), bucket=st.integers(4, 100))
def test_buckets_keep_order_and_stay_under_the_size_unless_one_tensor_is_larger(sizes, bucket):
    named = [(f"t{i}", torch.zeros(n, dtype=torch.float32)) for i, n in enumerate(sizes)]  # 4 bytes each
    out = list(buckets(iter(named), bucket))
    assert [name for b in out for name, _ in b] == [name for name, _ in named]
    for b in out:
        total = sum(t.numel() * 4 for _, t in b)
        assert b and (total <= bucket or len(b) == 1)
    for first, second in zip(out, out[1:]):  # a bucket closes only when the next tensor would not fit
        assert sum(t.numel() * 4 for _, t in first) + second[0][1].numel() * 4 > bucket


def test_buckets_read_the_tensors_lazily():
    seen = []

    def gathered():
        for i in range(6):
            seen.append(i)
            yield f"t{i}", torch.zeros(10)

    stream = buckets(gathered(), 80)  # two tensors per bucket
    assert [name for name, _ in next(stream)] == ["t0", "t1"]
    assert seen == [0, 1, 2]  # the third tensor closed the first bucket; nothing further was gathered


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_named_weights_stay_on_the_gpu_and_the_sync_casts_there(model):
    """NCCL broadcasts CUDA tensors only: the trainer's gathers stay on its device, and the cast to
    the servers' dtype happens there (no CPU copy of the model)."""
    from rollpacker.backends.sglang.weights import DistributedWeightSync
    from rollpacker.backends.trainer.pytorch import TorchTrainer, TorchTrainerConfig

    trainer = TorchTrainer(TorchTrainerConfig(model_dir=model, device="cuda", dtype="float32"))
    sync = DistributedWeightSync(None, master_address="127.0.0.1", master_port=1, dtype=torch.bfloat16)
    sent = list(sync._prepared(trainer.named_weights()))
    assert sent and all(t.is_cuda and t.dtype == torch.bfloat16 and t.is_contiguous() for _, t in sent)
    assert {n for n, _ in sent} == set(trainer.export_weights())
