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
