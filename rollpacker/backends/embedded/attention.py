"""The embedded engine's attention, registered as an HF attention implementation and switched on only
for the runner's own forwards (runner.py, "Theory of operation"): queries attend to keys read straight
from the slot buffers of the KV cache under the runner's bool mask; grouped-query heads by reshaping
the queries, never by copying the cache per head.  Prefill (many query tokens) goes to SDPA's fused
kernels; decode and verify forwards (a few tokens a row) to two matmuls."""

from __future__ import annotations

import torch
from transformers import AttentionInterface

ATTENTION_NAME = "rollpacker_slots"
_MATMUL_MAX_QUERY = 16  # above this many query tokens per row (prefill), use SDPA's fused kernels


def _slot_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention of `query` [B, H, T, D] over `key`/`value` [B, KVH, L, D] under a bool mask
    [B, 1, T, L]; returns [B, T, H, D] as HF attention implementations do."""
    b, h, t, d = query.shape
    kvh, length = key.shape[1], key.shape[2]
    scale = scaling if scaling is not None else d ** -0.5
    if t > _MATMUL_MAX_QUERY or getattr(module, "_rollpacker_sdpa", False):
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, scale=scale, enable_gqa=h != kvh)
        return out.transpose(1, 2), None
    g = h // kvh
    q = query.reshape(b, kvh, g * t, d)
    scores = torch.matmul(q, key.transpose(-1, -2))
    if scores.dtype in (torch.float16, torch.bfloat16):
        scores = scores.float()
    scores = scores.view(b, kvh, g, t, length) * scale
    scores = torch.where(attention_mask[:, :, None], scores, float("-inf"))  # one op: no inverted mask
    probs = torch.softmax(scores, dim=-1).to(value.dtype).view(b, kvh, g * t, length)
    out = torch.matmul(probs, value).view(b, h, t, d)
    return out.transpose(1, 2), None


AttentionInterface.register(ATTENTION_NAME, _slot_attention)
