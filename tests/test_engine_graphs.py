"""CUDA graphs of the embedded engine: every decode bucket is captured when the engine starts,
before the first request and on the thread that builds it (so no capture races a trainer on
another thread, and none lands in a timed step); the buckets cover every decode the engine runs;
a capture that fails raises naming its bucket, never a silent eager fallback; `--cuda-graphs /
--no-cuda-graphs` reaches the engine.  The CPU tests check what needs no GPU (the buckets against
the shapes real CPU decodes use, the flag, the errors); the rest is marked `gpu`."""

from __future__ import annotations

import threading

import pytest
import torch
from engine_batches import LONGEST_ROW, MAX_NEW, request_specs, run_waves, spec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollpacker.backends.embedded.engine import EmbeddedEngine
from rollpacker.backends.embedded.runner import Runner
from rollpacker.backends.errors import EngineFailed, GraphCaptureFailed
from rollpacker.backends.models import load_model, tiny_random_llama
from rollpacker.core.errors import ConfigError
from rollpacker.core.protocols import GenerationRequest


@pytest.fixture(scope="module")
def model():
    return load_model(tiny_random_llama())[0]


@pytest.fixture(scope="module")
def cuda_model():
    return load_model(tiny_random_llama(), device="cuda")[0]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=request_specs, capacity=st.integers(1, 6), spec_max_rows=st.sampled_from([0, 2, 6]),
       spec_tokens=st.integers(1, 4))
def test_the_captured_buckets_cover_every_decode_the_engine_runs(model, specs, capacity, spec_max_rows, spec_tokens):
    """On CPU the engine decodes eagerly but records each decode's (rows bucket, tokens per row,
    columns): every one is a key that `capture_graphs` captures on CUDA, for the cache sized up front."""
    engine = EmbeddedEngine(model, capacity=capacity, stop_token_ids=(), spec_max_rows=spec_max_rows,
                            spec_tokens=spec_tokens, kv_tokens_per_row=LONGEST_ROW)
    runner = engine._runner
    try:
        run_waves(engine, specs)
    finally:
        engine.close()
    planned = set(runner.graph_keys(length=LONGEST_ROW))  # the cache, allocated once at the planned size
    assert runner.decode_keys <= planned, runner.decode_keys - planned


def test_bucket_keys_are_exhaustive_and_cheap_for_any_capacity(model):
    """Every decode shape a runner can be asked for (rows, tokens per row, columns needed) maps to a
    key in `graph_keys`; a huge capacity does not enumerate every row count."""
    runner = Runner(model, 0, capacity=40, col_multiple=32, verify_rows=5, verify_tokens=3)
    runner.reserve(200)
    assert runner.cache.length == 256  # rounded up to the allocation step
    keys = set(runner.graph_keys())
    for n in range(1, 41):
        for t in range(1, 5 if n <= 5 else 2):
            for need in range(t + 1, 257):
                assert (runner._bucket(n), t, runner._read_len(need)) in keys, (n, t, need)
    assert max(c for _, _, c in keys) == 256 and len(keys) == len(set(keys))
    huge = Runner(model, 0, capacity=10**9)
    assert huge.graph_keys(length=64)[0] == (10**9, 1, 64)  # the largest forward, captured first
    ordered = runner.graph_keys()
    assert ordered == sorted(ordered, key=lambda k: (k[0] * k[1], k[2]), reverse=True)


def test_cuda_graphs_on_a_cpu_model_is_one_clear_error(model):
    with pytest.raises(ConfigError, match="cuda_graphs=True needs the model on CUDA"):
        EmbeddedEngine(model, capacity=2, cuda_graphs=True)
    with EmbeddedEngine(model, capacity=2, cuda_graphs=False, kv_tokens_per_row=32) as engine:
        assert engine.capture_s == 0.0 and not engine._runner.use_graphs


def test_the_cuda_graphs_flag_reaches_the_engine():
    from rollpacker.train.config import parse

    assert parse([]).cuda_graphs is True and parse(["--no-cuda-graphs"]).cuda_graphs is False
    assert parse([]).rollout_options().engine_options(300)["cuda_graphs"] is None  # on CUDA, off on CPU
    options = parse(["--no-cuda-graphs", "--engine-capacity", "7"]).rollout_options().engine_options(300)
    assert options["cuda_graphs"] is False and options["capacity"] == 7 and options["kv_tokens_per_row"] == 300


# -- on a GPU --------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_every_graph_is_captured_before_the_first_request_and_none_after(cuda_model):
    engine = EmbeddedEngine(cuda_model, capacity=6, stop_token_ids=(), spec_max_rows=2, spec_tokens=3,
                            kv_tokens_per_row=LONGEST_ROW)
    runner = engine._runner
    captured = dict(runner._graphs)
    capture_s = engine.capture_s
    assert runner.use_graphs and capture_s > 0
    assert set(captured) == set(runner.graph_keys()) and any(t > 1 for _, t, _ in captured)
    specs = [spec(m, group=i % 2, greedy=i % 3 == 0, wave=i % 3) for i, m in enumerate((1, MAX_NEW, 3, 9, 2, MAX_NEW, 5, 1))]
    results, _ = run_waves(engine, specs)
    assert {r: len(x.token_ids) for r, x in results.items()} == {f"r{i}": s["max_new"] for i, s in enumerate(specs)}
    assert engine.capture_s == capture_s, "a graph was captured after the engine started"
    assert runner._graphs.keys() == captured.keys() and all(runner._graphs[k] is g for k, g in captured.items())
    assert runner.decode_keys <= set(captured)


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_a_capture_that_fails_raises_naming_the_bucket(cuda_model):
    def uncapturable(module, args, output):
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("an op that cannot be captured")

    # the first bucket captured: the largest forward (two rows, one token, all 40 columns of the cache)
    rows, tokens, columns = Runner(cuda_model, 0, capacity=2).graph_keys(length=40)[0]
    assert (rows, tokens, columns) == (2, 1, 40)
    hook = cuda_model.model.layers[0].register_forward_hook(uncapturable)
    try:
        failed_bucket = rf"rows={rows} tokens_per_row={tokens} columns={columns} failed: RuntimeError: an op that"
        with pytest.raises(GraphCaptureFailed, match=failed_bucket):
            EmbeddedEngine(cuda_model, capacity=2, kv_tokens_per_row=40, spec_max_rows=0)
        # no cache size up front: the capture runs at the first prefill, and the failure ends the engine loudly
        engine = EmbeddedEngine(cuda_model, capacity=2, stop_token_ids=(), spec_max_rows=0)
        engine.submit([GenerationRequest("a", (5, 6, 7), 4)])
        with pytest.raises(EngineFailed) as failed:
            while True:
                engine.poll(5.0)
        assert isinstance(failed.value.__cause__, GraphCaptureFailed)
        engine.close()
    finally:
        hook.remove()


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_graphs_captured_mid_run_while_another_thread_allocates_on_the_gpu(cuda_model):
    """A cache that grows captures again on the engine thread; the main thread meanwhile allocates
    and computes on the GPU, as a trainer does (legal with thread-local capture mode)."""
    engine = EmbeddedEngine(cuda_model, capacity=4, stop_token_ids=())  # no size up front: grows 64 -> 128 -> 256
    stop, errors = threading.Event(), []

    def requests() -> None:
        try:
            results, _ = run_waves(engine, [spec(m) for m in (MAX_NEW, 150, 1, 200)])
            assert [len(results[f"r{i}"].token_ids) for i in range(4)] == [MAX_NEW, 150, 1, 200]
        except BaseException as exc:  # noqa: BLE001 - reported on the main thread
            errors.append(exc)
        finally:
            stop.set()

    worker = threading.Thread(target=requests)
    worker.start()
    x = torch.randn(256, 256, device="cuda")
    while not stop.is_set():
        blocks = [torch.empty(1 << 20, device="cuda") for _ in range(4)]  # fresh allocations, as a trainer makes
        x = torch.tanh(x @ x) + blocks[0][: x.numel()].view_as(x).zero_()
        del blocks
    worker.join()
    assert not errors, errors[0]
    assert engine.capture_s > 0 and engine._runner.cache.length >= 256


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_the_memory_plan_covers_what_the_graphs_keep():
    """At the memory test's sizes (the 4-layer tiny model in bfloat16, capacity 128, 128 + 512 tokens,
    speculation at 4 rows x 4 drafts), measured in a fresh process as a run's first engine (after other
    CUDA work in the same process the pool read 330 MiB less, the cuBLAS workspaces of streams used
    before: the test passed or failed by its order):
    the KV cache is the plan's exactly, every graph writes one logits buffer that is the plan's outputs
    exactly, and what the allocator still holds for the graphs after `empty_cache` (their pool) is
    within the plan's cuda_graphs item."""
    from memory_probe import run_probe

    r = run_probe({"probe": "graphs", "model": str(tiny_random_llama(num_layers=4, hidden_size=256)), "capacity": 128,
                   "prompt": 128, "max_tokens": 512, "micro_batch_tokens": 1024, "spec_max_rows": 4, "spec_tokens": 4})
    assert r["logits_buffers"] == 1, "every graph writes the one logits buffer"
    assert r["kv"] == r["plan_kv"] and r["keys_match"] and r["outputs"] == r["plan_outputs"], r
    assert r["outputs"] <= r["pool"] <= r["plan_graphs"], (
        f"{r['graphs']} graphs hold {r['pool'] / 2**20:.1f} MiB in the allocator ({r['device'] / 2**20:.1f} MiB on "
        f"the device), the plan counts {r['plan_graphs'] / 2**20:.1f} MiB, outputs {r['outputs'] / 2**20:.1f} MiB")
