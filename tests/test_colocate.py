"""Colocated mode (--colocate): rollout and training take turns on the same device.

- The embedded engine: `release_memory` frees its weights and its KV cache (their bytes drop to
  zero), generating while released is refused with a clear error, and after `resume_memory` and the
  weight update the greedy tokens equal those of before (on CPU; on CUDA with every decode graph
  captured again, `gpu`).
- The driver over real `rollpacker serve` processes: micro-batches wait for the round's end, the
  server sees release -> (the trainer runs) -> resume weights -> weight update -> resume KV cache ->
  generate, in that order, and the greedy tokens after a colocated step are the trainer's.
- The memory plan: colocated, the engine's items and the trainer's activations are not summed.
"""

from __future__ import annotations

import re
import time

import pytest
import torch
from devices import DEVICES

from rollpacker.backends.embedded.engine import EmbeddedEngine, EngineReleased
from rollpacker.backends.errors import BackendMisuse
from rollpacker.backends.models import load_model, tiny_random_llama
from rollpacker.core.errors import ConfigError
from rollpacker.core.protocols import GenerationRequest, GenerationResult, ReleasableEngine

NUM_NEW = 12


def greedy(engine, rid: str, prompt=(1, 5, 9, 2)) -> tuple[int, ...]:
    engine.submit([GenerationRequest(rid, tuple(prompt), NUM_NEW, temperature=0.0)])
    end = time.monotonic() + 120
    while time.monotonic() < end:
        for event in engine.poll(0.5):
            if isinstance(event, GenerationResult):
                return event.token_ids
    raise AssertionError(f"no result for {rid} in 120 s")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("device", DEVICES)
def test_release_frees_weights_and_kv_cache_and_resume_plus_sync_generates_the_same(device):
    model, _ = load_model(tiny_random_llama(), device=device)
    weights = {k: v.clone() for k, v in model.state_dict().items()}  # what the trainer would send
    with EmbeddedEngine(model, capacity=4, stop_token_ids=(), kv_tokens_per_row=64) as engine:
        assert isinstance(engine, ReleasableEngine)
        before = greedy(engine, "a")
        held = engine.memory_bytes()
        assert held["weights"] > 0
        cuda_before = torch.cuda.memory_allocated() if device == "cuda" else 0
        captured = engine.capture_s

        engine.release_memory()
        assert engine.memory_bytes() == {"weights": 0, "kv_cache": 0}
        assert all(p.numel() == 0 for p in model.parameters())
        if device == "cuda":
            assert torch.cuda.memory_allocated() <= cuda_before - held["weights"] - held["kv_cache"] // 2
        with pytest.raises(EngineReleased, match="released .*weights, kv_cache.*resume_memory"):
            greedy(engine, "b")
        with pytest.raises(EngineReleased, match="resume_memory"):
            engine.update_weights(weights, version=1)

        engine.resume_memory(["weights"])  # slime's and veRL's order: weights, the update, then the cache
        with pytest.raises(BackendMisuse, match="update_weights before generating"):
            greedy(engine, "c")
        engine.update_weights(weights, version=1)
        with pytest.raises(EngineReleased, match="kv_cache"):
            greedy(engine, "d")
        engine.resume_memory(["kv_cache"])
        assert engine.memory_bytes()["weights"] == held["weights"]
        assert greedy(engine, "e") == before
        if device == "cuda":  # the cache at its planned size and every graph again, at resume
            assert engine.memory_bytes()["kv_cache"] == held["kv_cache"] > 0
            assert engine.capture_s > captured


def test_release_refuses_while_requests_run_and_unknown_tags():
    model, _ = load_model(tiny_random_llama())
    with EmbeddedEngine(model, capacity=2, stop_token_ids=()) as engine:
        engine.pause()
        engine.submit([GenerationRequest("x", (1, 2, 3), 8, temperature=0.0)])
        with pytest.raises(BackendMisuse, match="1 request.* still in flight"):
            engine.release_memory()
        with pytest.raises(ConfigError, match="unknown memory tag.*'cuda_graph'"):
            engine.release_memory(["cuda_graph"])
        engine.resume()
        end = time.monotonic() + 120
        while not any(isinstance(e, GenerationResult) for e in engine.poll(0.5)):
            assert time.monotonic() < end, "x did not finish"
        engine.release_memory(["kv_cache"])  # the weights stay: no update needed after resume
        assert engine.memory_bytes()["kv_cache"] == 0 < engine.memory_bytes()["weights"]
        with pytest.raises(EngineReleased, match=r"released \(kv_cache\)"):
            engine.submit([GenerationRequest("y", (1, 2, 3), 8, temperature=0.0)])
        engine.resume_memory()
        assert len(greedy(engine, "z")) == NUM_NEW



@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["colocate", "train_after_round"])
def test_colocated_loop_trains_only_with_the_embedded_engine_released_then_resumes_with_the_trainers_weights(mode):
    """Tail batching (P=2, R=2: 3 groups of 3) on an engine of 3 rows: the first group completes,
    and its micro-batch is ready, while the others still decode; colocated, it waits for the round's
    end and trains with the engine's weights and KV cache freed; with train_after_round it waits the
    same, the engine keeping its memory."""
    from test_train_worker import ParityRewards
    from test_weight_sync import reference_greedy

    from rollpacker.backends.trainer.pytorch import TorchTrainer, TorchTrainerConfig
    from rollpacker.core import BatcherConfig, Scheduler, make_policy
    from rollpacker.driver import LoopConfig, StepLoop

    tiny = tiny_random_llama()
    model, _ = load_model(tiny)
    engine = EmbeddedEngine(model, capacity=3, stop_token_ids=())
    seen: list[dict] = []

    class WatchingTrainer(TorchTrainer):  # the real trainer; notes the engine's memory at each call
        def forward_backward(self, batch):
            seen.append(engine.memory_bytes())
            return super().forward_backward(batch)

        def optimizer_step(self, loss_normalizer):
            seen.append(engine.memory_bytes())
            return super().optimizer_step(loss_normalizer)

    trainer = WatchingTrainer(TorchTrainerConfig(model_dir=str(tiny), lr=1e-2, seed=0, device="cpu"))
    sched = Scheduler(make_policy("tail", prompts=2, samples=2, max_tokens=12), num_prompts=4,
                      batcher=BatcherConfig(token_budget=1))
    loop = StepLoop(sched, engine, ParityRewards(), trainer, Prompts(), LoopConfig(**{mode: True}))
    try:
        kept = engine.memory_bytes()  # (what train_after_round keeps)
        record = loop.run_step()
        after = greedy(engine, "after", prompt=(1, 2, 3))
        version = engine.weight_version
    finally:
        loop.close()
        engine.close()
    assert any(i.outcome == "aborted" for i in loop.last_timeline), "the case under test: the tail was aborted"
    assert len(seen) == 5 and record["trained_prompts"] == 2, "4 micro-batches and the optimizer step"
    if mode == "colocate":
        assert all(m == {"weights": 0, "kv_cache": 0} for m in seen), f"the trainer ran beside the engine: {seen}"
    else:  # (the KV cache follows the rows decoding, none once the round is over: the weights tell)
        assert all(m["weights"] == kept["weights"] > 0 for m in seen), f"the weights were released: {seen}"
    assert record["train_overlapped_s"] == 0.0 and record["sync_s"] > 0
    assert version == 1 and after == reference_greedy(str(tiny), trainer.export_weights())


# -- the driver over a real `rollpacker serve` ----------------------------------------------------

CALL = re.compile(r"call (\w+) (/\w+) at=([\d.]+)")
TAGS = re.compile(r"(/\w+_memory_occupation) tags=(\[.*\])")


def parity_scorer(task, entry, response) -> float:
    """Reward 1 for a response whose first token id is even: groups whose rewards differ."""
    return float(response[0] % 2 == 0)


class Prompts:
    def __len__(self) -> int:
        return 4

    def prompt_ids(self, index: int) -> tuple[int, ...]:
        return (1, 100 + index, 7)

    def reward_job(self, request_id, index, response_ids):
        from rollpacker.core.protocols import RewardJob

        return RewardJob(request_id, "parity", index, tuple(response_ids))


def post(url: str, path: str, body: dict) -> tuple[int, str]:
    """(HTTP status, error message or "") of a JSON POST."""
    import json
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, ""
    except urllib.error.HTTPError as exc:
        answer = json.loads(exc.read())
        return exc.code, answer.get("message") or answer["error"]["message"]


def server_calls(log_text: str) -> list[tuple[str, float, str]]:
    """(path, wall-clock time, memory tags or "") of every call the server logged, in order."""
    calls = []
    for line in log_text.splitlines():
        if (m := CALL.search(line)) is not None:
            calls.append((m.group(2), float(m.group(3)), ""))
        elif (m := TAGS.search(line)) is not None and calls and calls[-1][0] == m.group(1):
            calls[-1] = (*calls[-1][:2], m.group(2))
    return calls


@pytest.mark.timeout(600)
def test_colocated_step_on_a_server_releases_trains_resumes_syncs_then_generates_the_trainers_tokens():
    pytest.importorskip("aiohttp")
    from sglang_helpers import SERVE_ARGS, tiny_model
    from test_weight_sync import reference_greedy

    from rollpacker.backends.rewards.pool import ProcessRewardExecutor
    from rollpacker.backends.sglang.client import SGLangEngine
    from rollpacker.backends.sglang.launch import launch_servers
    from rollpacker.backends.trainer.pytorch import TorchTrainer, TorchTrainerConfig
    from rollpacker.core import BatcherConfig, Scheduler, make_policy
    from rollpacker.driver import LoopConfig, StepLoop

    model = tiny_model()
    stamps: list[tuple[str, float]] = []

    class StampedTrainer(TorchTrainer):  # the real trainer; each call's wall-clock span is noted
        def forward_backward(self, batch):
            stamps.append(("train", time.time()))
            stats = super().forward_backward(batch)
            stamps.append(("train", time.time()))
            return stats

        def optimizer_step(self, loss_normalizer):
            stats = super().optimizer_step(loss_normalizer)
            stamps.append(("optimizer step", time.time()))
            return stats

    trainer = StampedTrainer(TorchTrainerConfig(model_dir=model, lr=1e-2, seed=0, device="cpu"))
    sched = Scheduler(make_policy("tail", prompts=2, samples=2, max_tokens=12), num_prompts=4,
                      batcher=BatcherConfig(token_budget=1))
    serve_args = (*SERVE_ARGS, "--capacity", "3", "--log-calls")  # 3 rows: the groups decode in turn
    with launch_servers(model, num_servers=1, kind="rollpacker", extra_args=serve_args,
                        timeout_s=120) as group, \
            SGLangEngine(group.urls, expected_model=model) as engine, \
            ProcessRewardExecutor(1, scorer=parity_scorer) as rewards:
        url = group.urls[0]
        assert post(url, "/release_memory_occupation", {"tags": ["cuda_graph"]}) == \
            (400, "/release_memory_occupation: unknown memory tag(s) ['cuda_graph']: the tags are ['weights', 'kv_cache']")
        assert post(url, "/resume_memory_occupation", {"tags": "weights"})[0] == 400  # a list, not a string
        loop = StepLoop(sched, engine, rewards, trainer, Prompts(), LoopConfig(colocate=True))
        try:
            record = loop.run_step()
        finally:
            loop.close()
        after = greedy(engine, "rp900000000000", prompt=(1, 2, 3))
        calls = server_calls(group.servers[0].log_path.read_text())
    assert record["trained_prompts"] == 2 and record["train_overlapped_s"] == 0.0
    paths = [c[0] for c in calls]
    release = next(i for i, (p, _, tags) in enumerate(calls) if p == "/release_memory_occupation" and tags)
    assert "/generate" in paths[:release] and "/generate" not in paths[release:-1] and paths[-1] == "/generate"
    protocol = [(p, tags) for p, _, tags in calls[release:] if p not in ("/pause_generation", "/continue_generation")]
    assert protocol == [("/release_memory_occupation", "['weights', 'kv_cache']"),
                        ("/resume_memory_occupation", "['weights']"),
                        ("/update_weights_from_disk", ""),
                        ("/resume_memory_occupation", "['kv_cache']"),
                        ("/generate", "")]
    released_at, resumed_at = calls[release][1], calls[release + 1][1]
    assert stamps and all(released_at < t < resumed_at for _, t in stamps), \
        "every micro-batch and the optimizer step ran while the engine's memory was released"
    assert after == reference_greedy(model, trainer.export_weights()), "after resume: the trainer's greedy tokens"


# -- the memory plan ------------------------------------------------------------------------------

def test_colocated_peak_is_the_trainer_state_plus_the_larger_of_engine_and_training():
    from test_memory_plan import smollm2_plan

    for sizes in ({}, {"micro_batch_tokens": 65536, "engine_capacity": 16}):  # the KV cache, then training, larger
        separate, colocated = smollm2_plan(**sizes), smollm2_plan(**sizes, colocate=True)
        items = separate.items
        assert colocated.items == items
        engine = items["engine_weights"] + items["kv_cache"] + items["prefill"]
        training = items["activations"] + items["logits"]
        assert separate.total == sum(items.values())
        assert colocated.total == items["trainer_state"] + items["cublas_workspace"] + max(engine, training)
        assert separate.total - colocated.total == min(engine, training) > 0
    assert engine < training, "the second case: colocated saves exactly the engine's items"
    assert smollm2_plan(with_engine=False, colocate=True).total == smollm2_plan(with_engine=False).total


def test_a_run_that_fits_only_colocated_is_refused_naming_colocate_and_runs_with_it():
    from test_memory_plan import GIB, smollm2_plan

    separate, colocated = smollm2_plan(), smollm2_plan(colocate=True)
    budget = (separate.total + colocated.total) // 2
    with pytest.raises(ConfigError) as info:
        smollm2_plan(budget=budget).check()
    message = str(info.value)
    assert "--colocate" in message and f"{colocated.total / GIB:.2f} GiB then" in message and "\n" not in message
    fits = smollm2_plan(budget=budget, colocate=True)
    fits.check()
    assert "(colocated" in fits.line()
    with pytest.raises(ConfigError) as info:  # colocated does not fit either: --colocate is not offered
        smollm2_plan(budget=colocated.total - 1).check()
    assert "--colocate" not in str(info.value)


def test_the_run_config_flag_reaches_the_plan():
    from rollpacker.train.config import RunConfig
    from rollpacker.train.session import plan_run_memory

    tiny = tiny_random_llama()
    plans = [plan_run_memory(RunConfig(colocate=c, trainer="torch"), tiny, Prompts(), "cpu") for c in (False, True)]
    assert not plans[0].colocated and plans[1].colocated and plans[1].total < plans[0].total


@pytest.mark.timeout(120)
def test_colocate_with_nccl_weight_sync_is_one_line_naming_disk_before_any_model_loads(tmp_path):
    """NCCL refuses two processes on one GPU, so a colocated server cannot join the trainer's group."""
    from test_faults import assert_one_clear_line
    from test_reference_train import run_train

    start = time.monotonic()
    proc = run_train("--preset", "tiny_debug", "--model", tiny_random_llama(), "--out", tmp_path / "run",
                     "--rollout", "sglang", "--sglang-urls", "http://127.0.0.1:30000", "--weight-sync", "nccl",
                     "--colocate", check=False, timeout=100)
    assert_one_clear_line(proc, 2, "--colocate with --weight-sync nccl", "--weight-sync disk:DIR")
    assert "Loading weights" not in proc.stderr and time.monotonic() - start < 60
    assert not (tmp_path / "run").exists()
