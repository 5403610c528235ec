"""The ops one decode step of the embedded runner launches per decoder layer (benchmarks/decode_ops.py):
a change that adds ops to every layer of every step fails here, and the ops cut give the same logits."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from rollpacker.backends.embedded.attention import _slot_attention
from rollpacker.backends.models import load_model, tiny_random_llama

_SPEC = importlib.util.spec_from_file_location("decode_ops", Path(__file__).parent.parent / "benchmarks" / "decode_ops.py")
decode_ops = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(decode_ops)

MAX_OPS_PER_LAYER = 69  # matmul attention, float32 on CPU (72 before the cuts of issue 51 item 4)


@pytest.fixture(scope="module")
def tiny_model():
    model, _ = load_model(tiny_random_llama(), device="cpu", dtype="float32")
    return model


def test_ops_per_layer_at_most_the_cut_count(tiny_model):
    counts = decode_ops.runner_counts(tiny_model, rows=4, context=16, attention="matmul", warmup=1)
    assert 0 < counts["ops_per_layer"] <= MAX_OPS_PER_LAYER
    assert counts["ops_per_step"] == counts["ops_per_layer"] * counts["num_layers"] + counts["ops_outside_layers"]
    assert "aten::bitwise_not" not in counts["layer_histogram"]


def test_masked_scores_match_the_inverted_mask_fill():
    gen = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(2, 4, 1, 8, generator=gen), torch.randn(2, 2, 6, 8, generator=gen),
                         torch.randn(2, 2, 6, 8, generator=gen))
    mask = (torch.arange(6).view(1, 1, 1, -1) <= torch.tensor([2, 4]).view(2, 1, 1, 1))
    out, _ = _slot_attention(torch.nn.Module(), query, key, value, mask)
    scores = (torch.matmul(query.reshape(2, 2, 2, 8), key.transpose(-1, -2)).view(2, 2, 2, 1, 6) * 8 ** -0.5)
    probs = torch.softmax(scores.masked_fill(~mask[:, :, None], float("-inf")), dim=-1).view(2, 2, 2, 6)
    assert torch.equal(out, torch.matmul(probs, value).view(2, 4, 1, 8).transpose(1, 2))

