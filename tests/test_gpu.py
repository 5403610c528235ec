"""One GPU end to end: a reference step with the engine and the trainer colocated on --device, the
engine's logits equal to the trainer's after a weight sync there (each on the CPU, and on CUDA marked
`gpu`, skipped without one), and the memory plan refusing a run that cannot fit the GPU."""

from __future__ import annotations

import json
import re

import pytest
from devices import DEVICES
from test_reference_train import records, run_train


@pytest.fixture(scope="module")
def tiny_model():
    from rollpacker.backends.models import tiny_random_llama

    return tiny_random_llama()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("device", DEVICES)
def test_one_reference_step_runs_on_the_device(tiny_model, tmp_path, device):
    out = tmp_path / "run"
    proc = run_train("--preset", "tiny_debug", "--model", tiny_model, "--out", out, "--steps", 1,
                     "--trainer", "torch", "--device", device)
    assert f"memory plan ({device}):" in proc.stdout and f" on {device}: " in proc.stdout
    (record,) = records(out)
    assert record["device"] == device and record["trained_prompts"] == 2 and record["generated_tokens"] > 0
    assert ("cuda_peak_gib" in record) == (device == "cuda") and record.get("cuda_peak_gib", 1) > 0
    assert json.loads((out / "state" / "trainer" / "rollpacker_trainer.json").read_text())["step"] == 1


@pytest.mark.timeout(180)
@pytest.mark.parametrize("device", DEVICES)
def test_engine_logits_match_the_trainer_after_a_weight_sync_on_the_device(tiny_model, device):
    """The run's own wiring: build_trainer reads RunConfig.device, the engine gets the same device."""
    import torch

    from rollpacker.backends.embedded.engine import EmbeddedEngine
    from rollpacker.core.protocols import MicroBatch, TrainSample
    from rollpacker.train.config import RunConfig
    from rollpacker.train.session import build_trainer

    config = RunConfig(model=str(tiny_model), trainer="torch", device=device, lr=1e-2)
    trainer, engine = build_trainer(config, tiny_model), EmbeddedEngine(str(tiny_model), capacity=4, device=device)
    ids = torch.randint(0, 1000, (2, 7), generator=torch.Generator().manual_seed(0)).to(device)
    logits = torch.no_grad()(lambda model: model(ids).logits)
    try:
        initial = logits(engine.model)
        samples = [TrainSample(tuple(row[:4].tolist()), tuple(row[4:].tolist()), adv, 1.0) for row, adv in zip(ids, (1.0, -1.0))]
        trainer.forward_backward(MicroBatch(tuple(samples)))
        trainer.optimizer_step(2.0)
        engine.pause()
        engine.update_weights(trainer.export_weights(), version=1)
        engine.resume()
        synced, policy = logits(engine.model), logits(trainer.model.hf)
        assert synced.device.type == policy.device.type == device
        assert (synced - initial).abs().max() > 1e-3, "the update did not change the engine"
        torch.testing.assert_close(synced, policy, atol=1e-3, rtol=0)
    finally:
        engine.close()


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_memory_plan_refuses_a_run_larger_than_the_gpu(tiny_model, tmp_path):
    proc = run_train("--preset", "tiny_debug", "--model", tiny_model, "--out", tmp_path / "run", "--trainer", "torch",
                     "--device", "cuda", "--engine-capacity", 10**9, check=False, timeout=110)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "memory plan (cuda):" in proc.stdout
    error = proc.stderr.strip().splitlines()[-1]
    # at a billion rows the decode graphs' logits outweigh the tiny model's KV cache: the plan names its biggest item
    assert re.search(r"biggest: (kv cache|cuda graphs) [0-9.]+ GiB", error), error
    assert "--engine-capacity" in error and "Traceback" not in proc.stderr
