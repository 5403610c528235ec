"""Tiny random Hugging Face checkpoints for the TorchTitan trainer tests (real HF directories,
written with save_pretrained; nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path


def make_tiny_checkpoint(path: Path, *, family: str = "llama", tied: bool = True, seed: int = 0) -> Path:
    """A 2-layer model, hidden 64, 4 heads / 2 kv heads (tp=2 divides both), vocab 320."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    common = dict(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=tied,
        rms_norm_eps=1e-5,
    )
    torch.manual_seed(seed)
    if family == "llama":
        model = LlamaForCausalLM(LlamaConfig(rope_theta=100000.0, **common))
    elif family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=32, rope_theta=1000000.0, **common))
    else:
        raise ValueError(family)
    model.save_pretrained(path)
    return Path(path)
