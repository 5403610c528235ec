"""From a Hugging Face checkpoint directory to a TorchTitan model description, and its weights.

`read_hf_config` reads and checks config.json; `model_spec_from_hf` picks the TorchTitan family
(llama3 or qwen3) and builds a flavor of our own from the HF numbers (TorchTitan's registry only
has fixed flavors); `read_hf_weights` reads the safetensors files and checks every tensor's name
and shape against what the flavor expects, naming the file and the tensor when one is off.
Tied input/output embeddings map to TorchTitan's `enable_weight_tying` (one shared parameter, so
an update through either use reaches both and the exported `model.embed_tokens.weight`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from attrs import frozen

from rollpacker.backends.models import read_config_json
from rollpacker.core.errors import ConfigError

SUPPORTED_MODEL_TYPES = ("llama", "qwen3")


@frozen
class TitanModelSpec:
    """What the trainer needs to build, parallelize and convert one model."""

    family: str
    """'llama3' or 'qwen3'."""
    model_config: Any
    """A TorchTitan Decoder.Config (Llama3Model.Config or Qwen3Model.Config)."""
    adapter_cls: type
    """Llama3StateDictAdapter or Qwen3StateDictAdapter (HF <-> TorchTitan names)."""
    parallelize_fn: Callable
    """parallelize_llama or parallelize_qwen3."""
    set_sharding: Callable
    """set_llama3_sharding_config or set_qwen3_sharding_config (fills the TP plan)."""
    tied_embeddings: bool


def read_hf_config(model_dir: str | Path) -> dict[str, Any]:
    """config.json of `model_dir`, checked for an architecture we can train."""
    path = Path(model_dir)
    config_file = path / "config.json"
    cfg = read_config_json(path)
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(
            f"{config_file}: model_type {model_type!r} (architectures {cfg.get('architectures')}) "
            f"is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise ConfigError(f"{config_file}: {key}=true is not supported (TorchTitan has no such biases)")
    if cfg.get("use_sliding_window"):
        raise ConfigError(f"{config_file}: use_sliding_window=true is not supported")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"{config_file}: hidden_act {cfg['hidden_act']!r} is not supported (silu only)")
    return cfg


def _rope_parameters(cfg: dict[str, Any]) -> dict[str, Any]:
    # transformers 5 writes rope_parameters; 4.x wrote rope_theta and rope_scaling.
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    params.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    params.setdefault("rope_type", params.get("type", "default"))
    return params


def model_spec_from_hf(
    cfg: dict[str, Any],
    *,
    inner_attention: Any,
    fuse_qkv: bool,
    max_seq_len: int | None,
    config_file: str = "config.json",
) -> TitanModelSpec:
    """A TorchTitan model config whose shapes are those of the HF config `cfg`."""
    import torch.nn as nn
    from torchtitan.models.common import ComplexRoPE, CosSinRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.config_utils import make_ffn_config, make_gqa_config

    dim = cfg["hidden_size"]
    n_heads = cfg["num_attention_heads"]
    n_kv_heads = cfg.get("num_key_value_heads") or n_heads
    head_dim = cfg.get("head_dim") or dim // n_heads
    vocab = cfg["vocab_size"]
    eps = cfg.get("rms_norm_eps", 1e-6)
    tied = bool(cfg.get("tie_word_embeddings", False))
    seq_len = max_seq_len or cfg.get("max_position_embeddings", 4096)
    rope = _rope_parameters(cfg)
    rope_kwargs: dict[str, Any] = {"dim": head_dim, "max_seq_len": seq_len, "theta": float(rope["rope_theta"])}
    if rope["rope_type"] == "llama3":
        rope_kwargs.update(
            scaling="llama",
            scaling_factor=float(rope["factor"]),
            low_freq_factor=float(rope["low_freq_factor"]),
            high_freq_factor=float(rope["high_freq_factor"]),
            original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
        )
    elif rope["rope_type"] != "default":
        raise ConfigError(f"{config_file}: rope type {rope['rope_type']!r} is not supported (default, llama3)")

    # Weights are always overwritten from the checkpoint; the init only has to be valid.
    init = {"weight": partial(nn.init.normal_, std=0.02), "bias": nn.init.zeros_}
    ones = {"weight": nn.init.ones_}

    def norm(size: int) -> RMSNorm.Config:
        return RMSNorm.Config(normalized_shape=size, eps=eps, param_init=ones)

    if cfg["model_type"] == "llama":
        from torchtitan.models.llama3 import Llama3Model, Llama3StateDictAdapter, parallelize_llama
        from torchtitan.models.llama3.model import Llama3TransformerBlock as Block

        from torchtitan.models.llama3.sharding import set_llama3_sharding_config as set_sharding

        family, model_cls, adapter_cls, parallelize_fn = "llama3", Llama3Model, Llama3StateDictAdapter, parallelize_llama
        rope_cfg, qk_norm = ComplexRoPE.Config(**rope_kwargs), None
    else:
        from torchtitan.models.qwen3 import Qwen3Model, parallelize_qwen3
        from torchtitan.models.qwen3.model import Qwen3TransformerBlock as Block
        from torchtitan.models.qwen3.sharding import set_qwen3_sharding_config
        from torchtitan.models.qwen3.state_dict_adapter import Qwen3StateDictAdapter

        set_sharding = partial(set_qwen3_sharding_config, enable_ep=False)

        family, model_cls, adapter_cls, parallelize_fn = "qwen3", Qwen3Model, Qwen3StateDictAdapter, parallelize_qwen3
        rope_cfg, qk_norm = CosSinRoPE.Config(**rope_kwargs), norm(head_dim)

    layers = [
        Block.Config(
            attention_norm=norm(dim),
            ffn_norm=norm(dim),
            attention=make_gqa_config(
                dim=dim,
                n_heads=n_heads,
                n_kv_heads=n_kv_heads,
                head_dim=head_dim,
                wqkv_param_init=init,
                wo_param_init=init,
                inner_attention=inner_attention,
                fuse_qkv=fuse_qkv,
                rope=rope_cfg,
                qk_norm=qk_norm,
            ),
            feed_forward=make_ffn_config(
                dim=dim, hidden_dim=cfg["intermediate_size"], w1_param_init=init, w2w3_param_init=init
            ),
        )
        for _ in range(cfg["num_hidden_layers"])
    ]
    model_config = model_cls.Config(
        dim=dim,
        vocab_size=vocab,
        enable_weight_tying=tied,
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=init),
        norm=norm(dim),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=init),
        layers=layers,
    )
    return TitanModelSpec(
        family=family,
        model_config=model_config,
        adapter_cls=adapter_cls,
        parallelize_fn=parallelize_fn,
        set_sharding=set_sharding,
        tied_embeddings=tied,
    )


def apply_parallel_plan(spec: TitanModelSpec, *, tp: int, sequence_parallel: bool, config_file: str) -> None:
    """Fill the model config's sharding plan (what TorchTitan's `update_from_config` does for a
    trainer, without importing its trainer module, which needs the `datasets` package)."""
    attention = spec.model_config.layers[0].attention
    n_heads, n_kv = attention.n_heads, attention.n_kv_heads or attention.n_heads
    if tp > 1 and (n_heads % tp or n_kv % tp):
        raise ConfigError(
            f"TitanConfig.tp={tp} must divide the attention heads ({n_heads}) and key/value heads "
            f"({n_kv}) of {config_file}"
        )
    spec.set_sharding(spec.model_config, enable_sp=sequence_parallel)


def expected_hf_shapes(adapter: Any, meta_model: Any) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape, from a model built on the meta device (full, unsharded shapes)."""
    titan_sd = {k: v for k, v in meta_model.state_dict().items()}
    return {name: tuple(t.shape) for name, t in adapter.to_hf(titan_sd).items()}


def read_hf_weights(model_dir: str | Path, expected: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """All tensors of the checkpoint's safetensors files, checked against `expected` shapes.

    Raises ConfigError naming the file and tensor for a missing tensor, an unexpected one, or a
    shape that does not match config.json.  (`lm_head.weight` may be absent when tied.)"""
    from safetensors import safe_open

    path = Path(model_dir)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"{path}: no *.safetensors weight files (only safetensors checkpoints are read)")
    tensors: dict[str, Any] = {}
    origin: dict[str, Path] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                if name.endswith("rotary_emb.inv_freq"):
                    continue
                if name == "lm_head.weight" and name not in expected and "model.embed_tokens.weight" in expected:
                    continue  # tied: some exporters write the shared matrix twice
                if name not in expected:
                    raise ConfigError(
                        f"{file}: tensor {name!r} is not part of a {path / 'config.json'} model "
                        f"(unsupported architecture variant?)"
                    )
                tensor = f.get_tensor(name)
                if tuple(tensor.shape) != expected[name]:
                    raise ConfigError(
                        f"{file}: tensor {name!r} has shape {tuple(tensor.shape)} but "
                        f"{path / 'config.json'} implies {expected[name]}"
                    )
                tensors[name] = tensor
                origin[name] = file
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise ConfigError(f"{path}: tensors missing from {[f.name for f in files]}: {missing[:5]}"
                          + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    return tensors
