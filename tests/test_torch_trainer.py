"""The plain PyTorch trainer (TorchTrainer) in one process, on a tiny random HF checkpoint: the
same loss and gradients as the transformers reference and as TitanTrainer, streamed micro-batches
summing to the full-batch gradient, bad input refused before backward, a checkpoint that restores
weights, optimizer state and step exactly (also after a kill mid-save), and the one-line error when
TorchTitan cannot import (torch 2.11 simulated by removing the name it misses)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from devices import DEVICES  # noqa: E402
from test_grpo_loss import ok_sample  # noqa: E402
from titan_dist_check import hf_reference, make_samples, max_abs_diff  # noqa: E402
from titan_tiny import make_tiny_checkpoint  # noqa: E402

from rollpacker.backends.errors import InvalidMicroBatch  # noqa: E402
from rollpacker.backends.titan.config import TitanConfig  # noqa: E402
from rollpacker.backends.trainer.pytorch import TorchTrainer, TorchTrainerConfig  # noqa: E402
from rollpacker.core.errors import ConfigError  # noqa: E402
from rollpacker.core.protocols import MicroBatch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GRAD_TOL = 1e-5  # float32, absolute (gradients here reach ~6)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "llama", family="llama", tied=True)


@pytest.fixture(scope="module")
def hf_model(tiny_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)


@pytest.fixture(scope="module")
def samples(tiny_dir, hf_model):
    return make_samples(320, hf_model)


def make_trainer(model_dir, device="cpu", **kw) -> TorchTrainer:
    kw = {"lr": 3e-4, "max_grad_norm": None, "logits_chunk_tokens": 7, **kw}  # 7: chunks cut mid-row
    return TorchTrainer(TorchTrainerConfig(model_dir=model_dir, device=device, **kw))


def stream(trainer, samples) -> float:
    """The batch as three uneven micro-batches; the summed loss."""
    return sum(trainer.forward_backward(MicroBatch(tuple(c))).loss_sum for c in (samples[:2], samples[2:3], samples[3:]))


# --- configuration ---------------------------------------------------------------------------


def test_config_validation_is_shared_and_names_the_class() -> None:
    for cls in (TorchTrainerConfig, TitanConfig):
        with pytest.raises(ConfigError, match=rf"{cls.__name__}\.betas must be two floats"):
            cls(model_dir="x", betas=(0.9, 1.5))
        with pytest.raises(ConfigError, match=rf"{cls.__name__}\.max_grad_norm must be > 0"):
            cls(model_dir="x", max_grad_norm=0.0)
        with pytest.raises(ConfigError, match=rf"{cls.__name__}\.device must be"):
            cls(model_dir="x", device="tpu")
    with pytest.raises(ConfigError, match=r"TorchTrainerConfig\.logits_chunk_tokens must be an int >= 1"):
        TorchTrainerConfig(model_dir="x", logits_chunk_tokens=0)
    assert TorchTrainerConfig(model_dir="x", clip_eps=0.1).clip_high == 0.1


def test_missing_checkpoint_is_refused_before_loading(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        TorchTrainer(TorchTrainerConfig(model_dir=tmp_path / "absent"))


# --- gradients -------------------------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("device", DEVICES)
def test_gradients_match_transformers_and_streaming_sums_to_the_full_batch(tiny_dir, hf_model, samples, device) -> None:
    trainer = make_trainer(tiny_dir, device=device)
    full = trainer.forward_backward(MicroBatch(tuple(samples)))
    grads_full = trainer.gradients()
    trainer.discard_gradients()
    ref_loss, ref_grads = hf_reference(hf_model, samples, clip_eps=0.2)
    assert full.loss_sum == pytest.approx(ref_loss, abs=1e-5 * max(1.0, abs(ref_loss)))
    assert max_abs_diff(grads_full, ref_grads) <= GRAD_TOL
    assert 0.0 < full.clip_fraction < 1.0  # the batch exercises both clip branches
    streamed_loss = stream(trainer, samples)
    assert streamed_loss == pytest.approx(full.loss_sum, abs=1e-5 * max(1.0, abs(full.loss_sum)))
    assert max_abs_diff(trainer.gradients(), grads_full) <= GRAD_TOL


@pytest.mark.timeout(120)
def test_gradients_and_steps_equal_the_titan_trainers(tiny_dir, samples) -> None:
    pytest.importorskip("torchtitan")
    import torch.distributed as dist

    from rollpacker.backends.titan.trainer import TitanTrainer, titan_import_error

    if titan_import_error() is not None:
        pytest.skip(titan_import_error())
    titan = TitanTrainer(TitanConfig(model_dir=tiny_dir, lr=3e-4, max_grad_norm=None, device="cpu"))
    ours = make_trainer(tiny_dir)
    try:
        for trainer in (titan, ours):
            stream(trainer, samples)
        assert max_abs_diff(ours.gradients(), titan.gradients()) <= GRAD_TOL
        steps = [t.optimizer_step(30.0) for t in (titan, ours)]
        assert steps[1].grad_norm == pytest.approx(steps[0].grad_norm, rel=1e-5)
        exported = [t.export_weights() for t in (titan, ours)]
        assert max_abs_diff(exported[1], exported[0]) <= 1e-6
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_a_micro_batch_padding_past_max_forward_tokens_runs_in_chunks_with_the_same_gradient(tiny_dir, hf_model) -> None:
    """One long response beside many short ones: budgeted by response tokens, but one forward would
    pad every short row to the long one.  Split into forwards of <= 40 padded tokens, the loss and
    gradients are the one forward's, and no forward holds more than the budget."""
    from rollpacker.core.protocols import TrainSample

    long_row = TrainSample(tuple(range(1, 6)), tuple(range(10, 40)), 0.5, 1.0)  # 34 columns
    short = [TrainSample((7 + k, 8), (9 + k,), (-1) ** k * 0.3, 1.0) for k in range(12)]  # 2 columns each
    batch = MicroBatch((short[0], long_row, *short[1:]))
    whole = make_trainer(tiny_dir)
    one = whole.forward_backward(batch)
    chunked = make_trainer(tiny_dir, max_forward_tokens=40)
    widths: list[tuple[int, int]] = []
    logprobs = chunked._logprobs
    chunked._logprobs = lambda model, packed: (widths.append(tuple(packed.input_ids.shape)), logprobs(model, packed))[1]
    split = chunked.forward_backward(batch)
    assert widths == [(1, 34), (12, 2)]  # without the budget: (13, 34), 442 padded tokens
    assert split.num_tokens == one.num_tokens == 30 + 12
    # each says what it ran: the step record's train_forwards and train_padded_tokens sum these
    assert (split.forwards, split.padded_tokens) == (2, 34 + 24) and (one.forwards, one.padded_tokens) == (1, 442)
    assert split.loss_sum == pytest.approx(one.loss_sum, abs=1e-6)
    assert max_abs_diff(chunked.gradients(), whole.gradients()) <= GRAD_TOL


@pytest.mark.timeout(120)
@pytest.mark.parametrize("trainer_kind", ["torch", "titan"])
def test_bfloat16_trains_float32_master_weights_so_a_step_at_lr_1e5_moves_every_tensor(tiny_dir, samples, trainer_kind) -> None:
    """Pure bfloat16 rounds an AdamW update of ~1e-5 away (a weight of 0.02 has a resolution of
    1.2e-4, a norm weight of 1.0 of 7.8e-3): the master weights and AdamW's state stay float32,
    bfloat16 is the compute dtype, and the engine gets the master weights cast to bfloat16."""
    if trainer_kind == "titan":
        pytest.importorskip("torchtitan")
        from rollpacker.backends.titan.trainer import TitanTrainer, titan_import_error

        if titan_import_error() is not None:
            pytest.skip(titan_import_error())
        trainer = TitanTrainer(TitanConfig(model_dir=tiny_dir, lr=1e-5, dtype="bfloat16", device="cpu"))
    else:
        trainer = make_trainer(tiny_dir, lr=1e-5, dtype="bfloat16", max_grad_norm=1.0)
    try:
        master = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        assert {p.dtype for p in master.values()} == {torch.float32}
        stream(trainer, samples)
        trainer.optimizer_step(30.0)
        after = dict(trainer.model.named_parameters())
        moved = [n for n, p in master.items() if not torch.equal(after[n].detach(), p)]
        assert len(moved) >= 0.9 * len(master), sorted(set(master) - set(moved))
        assert {v.dtype for s in trainer.optimizer.state.values() for k, v in s.items() if k != "step"} == {torch.float32}
        exported = trainer.export_weights()
        assert {t.dtype for t in exported.values()} == {torch.bfloat16}
        if trainer_kind == "torch":
            for name, p in after.items():
                assert torch.equal(exported[name.removeprefix("hf.")], p.detach().to(torch.bfloat16)), name
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _titan_or_skip():
    pytest.importorskip("torchtitan")
    from rollpacker.backends.titan.trainer import TitanTrainer, titan_import_error

    if titan_import_error() is not None:
        pytest.skip(titan_import_error())
    return TitanTrainer


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("trainer_kind", "head_matmuls"), [("torch", 4), ("titan", 3)])
def test_the_lm_head_runs_only_at_response_positions_with_the_same_gradients(tiny_dir, samples, trainer_kind,
                                                                                head_matmuls) -> None:
    """A prompt's positions never reach the LM head: against `response_logits_only=False` (the head
    at every position), the same loss and gradients for exactly (positions - response tokens) x
    the head's matmuls fewer FLOPs (torch's FLOP counter): forward and two in backward, and the
    plain trainer's chunk recompute."""
    from torch.utils.flop_counter import FlopCounterMode

    def run(response_logits_only: bool):
        config = {"model_dir": tiny_dir, "lr": 3e-4, "max_grad_norm": None, "device": "cpu",
                  "response_logits_only": response_logits_only}
        trainer = (_titan_or_skip()(TitanConfig(**config)) if trainer_kind == "titan" else
                   TorchTrainer(TorchTrainerConfig(**config)))
        try:
            counter = FlopCounterMode(display=False)
            with counter:
                loss = trainer.forward_backward(MicroBatch(tuple(samples))).loss_sum
            return loss, trainer.gradients(), counter.get_total_flops()
        finally:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()

    (loss, grads, flops), (whole_loss, whole_grads, whole_flops) = run(True), run(False)
    positions = len(samples) * max(len(s.prompt_ids) + len(s.response_ids) - 1 for s in samples)
    others = positions - sum(len(s.response_ids) for s in samples)
    assert whole_flops - flops == others * head_matmuls * 2 * 64 * 320  # hidden 64, vocab 320
    assert loss == pytest.approx(whole_loss, abs=1e-5 * max(1.0, abs(whole_loss)))
    assert max_abs_diff(grads, whole_grads) <= GRAD_TOL


@pytest.mark.timeout(60)
def test_bad_batch_refused_before_backward(tiny_dir) -> None:
    trainer = make_trainer(tiny_dir)
    bad = MicroBatch((ok_sample(), ok_sample(response_ids=(3, 999))))
    with pytest.raises(InvalidMicroBatch, match="sample 1: token id 999 is outside the vocabulary"):
        trainer.forward_backward(bad)
    assert all(p.grad is None for p in trainer.model.parameters())
    with pytest.raises(ConfigError, match="loss_normalizer"):
        trainer.optimizer_step(float("nan"))


@pytest.mark.timeout(60)
def test_kl_to_the_frozen_reference_is_zero_at_start_and_grows_after_a_step(tiny_dir) -> None:
    trainer = make_trainer(tiny_dir, kl_coef=0.5, lr=1e-2)
    assert all(not p.requires_grad for p in trainer.ref_model.parameters())
    batch = MicroBatch((ok_sample(advantage=1.0), ok_sample(prompt_ids=(9, 8, 7), response_ids=(6,), advantage=-1.0)))
    first = trainer.forward_backward(batch)
    assert first.loss_sum == pytest.approx(-3.0 + 1.0, abs=1e-6)  # ratio 1, KL 0: -sum_t w A
    trainer.optimizer_step(float(first.num_tokens))
    second = trainer.forward_backward(batch)
    trainer.discard_gradients()
    assert second.loss_sum > first.loss_sum + 1e-9  # ratio still 1 (old = current): the change is the KL


# --- checkpoint ------------------------------------------------------------------------------


def _optimizer_tensors(trainer) -> dict[str, torch.Tensor]:
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    return {f"{names[id(p)]}.{k}": v.clone() for p, s in trainer.optimizer.state.items() for k, v in s.items()}


def _next_two_losses(trainer, samples) -> list[float]:
    first = stream(trainer, samples)
    trainer.optimizer_step(30.0)
    second = stream(trainer, samples)
    trainer.discard_gradients()
    return [first, second]


@pytest.mark.timeout(120)
def test_save_kill_load_restores_weights_optimizer_and_step(tiny_dir, samples, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    trainer = make_trainer(tiny_dir)
    for _ in range(2):
        stream(trainer, samples)
        trainer.optimizer_step(30.0)
    trainer.save(ckpt)
    weights, optim, step = trainer.export_weights(), _optimizer_tensors(trainer), trainer.step
    expected = _next_two_losses(trainer, samples)
    stream(trainer, samples)
    trainer.optimizer_step(30.0)
    moved = trainer.export_weights()
    assert max_abs_diff(moved, weights) > 0
    # A later save killed in the middle: a half-written `.saving` directory, the old one whole.
    (tmp_path / "ckpt.saving").mkdir()
    (tmp_path / "ckpt.saving" / "__0_0.distcp").write_bytes(b"torn")

    fresh = make_trainer(tiny_dir)  # a new process would start from the initial weights too
    fresh.load(ckpt)
    assert fresh.step == step == 2
    assert max_abs_diff(fresh.export_weights(), weights) == 0.0
    restored = _optimizer_tensors(fresh)
    assert sorted(restored) == sorted(optim) and max_abs_diff(restored, optim) == 0.0
    assert _next_two_losses(fresh, samples) == pytest.approx(expected, abs=1e-6, rel=0)
    # Killed between save's two renames: only `<path>.previous` holds the checkpoint.
    ckpt.rename(tmp_path / "ckpt.previous")
    fresh.load(ckpt)
    assert fresh.step == 2 and max_abs_diff(fresh.export_weights(), weights) == 0.0
    # The next save replaces the torn `.saving`, and a Titan checkpoint is refused by name.
    fresh.save(ckpt)
    assert not (tmp_path / "ckpt.saving").exists() and not (tmp_path / "ckpt.previous").exists()
    state = ckpt / "rollpacker_trainer.json"
    state.write_text(state.read_text().replace("TorchTrainer", "TitanTrainer"))
    with pytest.raises(ConfigError, match="written by TitanTrainer, not TorchTrainer"):
        fresh.load(ckpt)


# --- --trainer titan where TorchTitan cannot import ------------------------------------------

_WITHOUT_TITAN_NAME = "import torch.distributed.fsdp as f; vars(f).pop('DataParallelMeshDims', None); "  # as torch 2.11
_TITAN_CANNOT_IMPORT = "import sys; sys.modules['torchtitan.models.llama3'] = None; "  # a TorchTitan that fails


@pytest.mark.timeout(120)
def test_titan_import_failure_is_one_line_before_any_model_loads(tmp_path: Path) -> None:
    pytest.importorskip("torchtitan")
    out = tmp_path / "run"
    code = (_TITAN_CANNOT_IMPORT + "import runpy, sys; sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    args = [str(ROOT / "reference" / "train.py"), "--preset", "tiny_debug", "--model", "/nonexistent", "--out", str(out)]
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=100, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"installed torch {torch.__version__}" in lines[0] and "--trainer torch" in lines[0]
    assert "torchtitan.models.llama3" in lines[0]
    assert "/nonexistent" not in lines[0] and not out.exists()  # failed before the model was looked up
    print(f"\n{lines[0]}  ({time.monotonic() - start:.1f} s)")


@pytest.mark.timeout(60)
def test_titan_imports_without_the_torch_2_13_name() -> None:
    """torch 2.11 (simulated: its missing name removed): titan.compat's stand-ins make TorchTitan import,
    the trainer picks partial_dtensor, and the stand-in refuses to be built."""
    pytest.importorskip("torchtitan")
    code = _WITHOUT_TITAN_NAME + (
        "from rollpacker.backends.titan import compat; from rollpacker.backends.titan.trainer import titan_import_error; "
        "print(titan_import_error(), compat.spmd_backend()); import torch.distributed.fsdp as f\n"
        "import torchtitan.models.common.attention as a; print(a._compiled_create_block_mask._rollpacker_shim)\n"
        "try:\n    f.DataParallelMeshDims(shard='fsdp')\nexcept RuntimeError as e:\n    print(e)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "None partial_dtensor" and lines[1] == "True", proc.stdout
    assert "needs torch>=2.13; use 'partial_dtensor'" in lines[2]


@pytest.mark.timeout(60)
def test_titan_check_passes_here_and_torch_trainer_skips_it() -> None:
    code = _TITAN_CANNOT_IMPORT + (
        "from rollpacker.train.config import RunConfig; RunConfig(trainer='torch').validate(); print('ok')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.stdout.strip() == "ok", proc.stderr[-2000:]
    if importlib.util.find_spec("torchtitan") is not None:  # with torch >= 2.13 TorchTitan imports
        from rollpacker.backends.titan.trainer import titan_import_error

        assert titan_import_error() is None
    from rollpacker.train.config import RunConfig

    with pytest.raises(ConfigError, match="--trainer torch shards over all --nproc ranks"):
        RunConfig(trainer="torch", tp=2, nproc=2).validate()
