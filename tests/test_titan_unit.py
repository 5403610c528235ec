"""The TorchTitan trainer in one process: bad input refused with errors that name what is wrong,
and the KL path.  (The loss, split and packing themselves: test_grpo_loss.py.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchtitan")

from test_grpo_loss import ok_sample  # noqa: E402
from titan_tiny import make_tiny_checkpoint  # noqa: E402

from rollpacker.backends.errors import InvalidMicroBatch  # noqa: E402
from rollpacker.backends.titan.config import TitanConfig  # noqa: E402
from rollpacker.core.errors import ConfigError  # noqa: E402
from rollpacker.core.protocols import MicroBatch  # noqa: E402


def test_config_validates_fields() -> None:
    with pytest.raises(ConfigError, match="tp"):
        TitanConfig(model_dir="x", tp=0)
    with pytest.raises(ConfigError, match="betas"):
        TitanConfig(model_dir="x", betas=(0.9, 1.5))
    with pytest.raises(ConfigError, match="max_grad_norm"):
        TitanConfig(model_dir="x", max_grad_norm=0.0)


# --- checkpoint directories ------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "llama", family="llama", tied=True)


def _expected_and_read(model_dir: Path):
    from rollpacker.backends.titan import compat as titan_compat, cpu as titan_cpu

    titan_compat.prepare_import()
    from rollpacker.backends.titan.model import expected_hf_shapes, model_spec_from_hf, read_hf_config, read_hf_weights

    cfg = read_hf_config(model_dir)
    spec = model_spec_from_hf(cfg, inner_attention=titan_cpu.cpu_inner_attention(), fuse_qkv=False, max_seq_len=None)
    with torch.device("meta"):
        model = spec.model_config.build()
    adapter = spec.adapter_cls(spec.model_config, None)
    return read_hf_weights(model_dir, expected_hf_shapes(adapter, model))


def test_missing_directory_and_config(tmp_path: Path) -> None:
    from rollpacker.backends.titan.model import read_hf_config

    with pytest.raises(ConfigError, match="does not exist"):
        read_hf_config(tmp_path / "nope")
    with pytest.raises(ConfigError, match="config.json is missing"):
        read_hf_config(tmp_path)


def test_unsupported_architecture_names_the_file(tiny_dir: Path, tmp_path: Path) -> None:
    from rollpacker.backends.titan.model import read_hf_config

    bad = tmp_path / "gpt2"
    shutil.copytree(tiny_dir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg.update(model_type="gpt2", architectures=["GPT2LMHeadModel"])
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"gpt2/config.json: model_type 'gpt2'.*not supported"):
        read_hf_config(bad)


def test_shape_mismatch_names_file_and_tensor(tiny_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "wrong_ffn"
    shutil.copytree(tiny_dir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["intermediate_size"] = 96  # the files hold 128
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"model.safetensors: tensor 'model.layers.0.mlp.(gate|up|down)_proj.weight' has shape"):
        _expected_and_read(bad)


def test_missing_tensor_is_named(tiny_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "missing"
    shutil.copytree(tiny_dir, bad)
    tensors = load_file(bad / "model.safetensors")
    del tensors["model.norm.weight"]
    save_file(tensors, bad / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConfigError, match=r"tensors missing from \['model.safetensors'\]: \['model.norm.weight'\]"):
        _expected_and_read(bad)


def test_trainer_refuses_missing_checkpoint_before_any_setup(tmp_path: Path) -> None:
    from rollpacker.backends.titan.trainer import TitanTrainer

    with pytest.raises(ConfigError, match="does not exist"):
        TitanTrainer(TitanConfig(model_dir=tmp_path / "absent"))


# --- a live trainer (world of one, in this process) ------------------------------------------


@pytest.fixture(scope="module")
def kl_trainer(tiny_dir: Path):
    import torch.distributed as dist

    from rollpacker.backends.titan.trainer import TitanTrainer

    trainer = TitanTrainer(TitanConfig(model_dir=tiny_dir, lr=1e-3, kl_coef=0.5, device="cpu"))
    yield trainer
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.timeout(60)
def test_bad_batch_refused_before_backward(kl_trainer) -> None:
    bad = MicroBatch((ok_sample(), ok_sample(advantage=float("nan"))))
    with pytest.raises(InvalidMicroBatch, match="sample 1: advantage is nan"):
        kl_trainer.forward_backward(bad)
    assert all(p.grad is None for p in kl_trainer.model.parameters())
    with pytest.raises(ConfigError, match="loss_normalizer"):
        kl_trainer.optimizer_step(0.0)


@pytest.mark.timeout(60)
def test_kl_to_reference_is_zero_at_start_and_grows_after_a_step(kl_trainer) -> None:
    batch = MicroBatch((ok_sample(advantage=1.0), ok_sample(prompt_ids=(9, 8, 7), response_ids=(6,), advantage=-1.0)))
    first = kl_trainer.forward_backward(batch)
    # Policy == reference and old == current: ratio 1, KL 0, loss = -sum w A per token.
    assert first.loss_sum == pytest.approx(-(3 * 1.0) + 1 * 1.0, abs=1e-6)
    assert first.clip_fraction == 0.0 and first.entropy_sum > 0.0
    step = kl_trainer.optimizer_step(float(first.num_tokens))
    assert step.grad_norm is not None and step.grad_norm > 0.0 and step.num_tokens == 4
    second = kl_trainer.forward_backward(batch)
    kl_trainer.discard_gradients()
    # Ratio is still 1 (old = current), so the whole change is the KL term, which is > 0.
    assert second.loss_sum > first.loss_sum + 1e-9


@pytest.mark.timeout(60)
def test_rollout_logprobs_used_or_ignored(kl_trainer) -> None:
    import attrs

    far_off = MicroBatch((ok_sample(old_logprobs=(-9.0, -9.0, -9.0)),))  # ratios ~e^3: all clipped
    used = kl_trainer.forward_backward(far_off)
    kl_trainer.discard_gradients()
    original = kl_trainer.config
    kl_trainer.config = attrs.evolve(original, use_rollout_logprobs=False)
    try:
        ignored = kl_trainer.forward_backward(far_off)
        kl_trainer.discard_gradients()
    finally:
        kl_trainer.config = original
    assert used.clip_fraction == 1.0 and ignored.clip_fraction == 0.0


def test_parallel_degrees_must_fit_the_world(kl_trainer, tiny_dir: Path) -> None:
    from rollpacker.backends.titan.trainer import TitanTrainer

    with pytest.raises(ConfigError, match=r"dp_shard=-1 tp=2 vs world size 1"):
        TitanTrainer(TitanConfig(model_dir=tiny_dir, tp=2, device="cpu"))


def test_tp_must_divide_heads(tiny_dir: Path) -> None:
    from rollpacker.backends.titan import compat as titan_compat, cpu as titan_cpu

    titan_compat.prepare_import()
    from rollpacker.backends.titan.model import apply_parallel_plan, model_spec_from_hf, read_hf_config

    cfg = read_hf_config(tiny_dir)
    cfg.update(num_attention_heads=6, num_key_value_heads=3, head_dim=16, hidden_size=96)  # SmolLM2-like 3 kv heads
    spec = model_spec_from_hf(cfg, inner_attention=titan_cpu.cpu_inner_attention(), fuse_qkv=False, max_seq_len=None)
    with pytest.raises(ConfigError, match=r"tp=2 must divide the attention heads \(6\) and key/value heads \(3\)"):
        apply_parallel_plan(spec, tp=2, sequence_parallel=True, config_file="config.json")
