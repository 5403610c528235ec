"""Micro-batch checks, packing, and the GRPO token loss: the one loss module of both trainers
(TorchTitan's in `titan.trainer`, plain PyTorch's in `trainer.pytorch`).

Loss (per response token t of sample i, advantage A_i, token weight w_i):

    ratio_t = exp(logp_t - old_logp_t)
    pg_t    = -min(ratio_t * A_i, clip(ratio_t, 1 - eps_low, 1 + eps_high) * A_i)
    kl_t    = exp(ref_t - logp_t) - (ref_t - logp_t) - 1          (k3 estimator, if kl_coef > 0)
    loss    = sum_i w_i * sum_t (pg_t + kl_coef * kl_t)

No mean is taken: the caller divides the accumulated gradient by the step's loss normaliser, so
micro-batches streamed one at a time sum to exactly the full-batch gradient (the core's contract).

When a sample carries no old log-probs, the old policy is the current one: parameters do not change
between optimizer steps, so its log-probs equal the forward pass's own, detached (ratio 1, the
clip inactive, gradient A_i * grad logp_t).  That is the recompute, without a second forward.

`check_micro_batch` runs before any tensor is built, on every rank alike, so a bad batch is refused
before any collective or backward starts.

`chunked_token_logprobs_and_entropy` gives the same log-probs and entropies as
`token_logprobs_and_entropy(hidden @ W.T, targets)` without ever holding a micro-batch's logits
whole: [tokens, vocab] float32 is 3.2 GB for 64 x 256 tokens of a 49k vocabulary.  Each chunk of
positions is projected, reduced to two numbers per position, and recomputed in backward
(torch.utils.checkpoint), so at most one chunk's logits are alive in either pass.

Only the positions that predict a response token reach the LM head (`response_positions`): the loss
reads no other, and a prompt's positions would otherwise cost their [vocab] logits, forward and
backward (most of a micro-batch's positions when prompts are long and answers short).  Their
log-probs and entropies are 0 (`at_positions`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from attrs import frozen

from rollpacker.backends.errors import InvalidMicroBatch
from rollpacker.core.protocols import MicroBatch, TrainSample


def check_micro_batch(batch: MicroBatch, *, vocab_size: int, max_seq_len: int) -> None:
    """Raise InvalidMicroBatch for anything that would give a wrong or undefined gradient."""
    if not batch.samples:
        raise InvalidMicroBatch("micro-batch has no samples")
    for i, s in enumerate(batch.samples):
        where = f"micro-batch sample {i}"
        if not s.response_ids:
            raise InvalidMicroBatch(f"{where} has no response tokens")
        if not s.prompt_ids:
            raise InvalidMicroBatch(f"{where} has an empty prompt (the first response token needs a context)")
        if len(s.prompt_ids) + len(s.response_ids) - 1 > max_seq_len:
            raise InvalidMicroBatch(
                f"{where}: prompt {len(s.prompt_ids)} + response {len(s.response_ids)} tokens exceed "
                f"max_seq_len {max_seq_len}"
            )
        if not math.isfinite(s.advantage):
            raise InvalidMicroBatch(f"{where}: advantage is {s.advantage}")
        if not math.isfinite(s.token_weight):
            raise InvalidMicroBatch(f"{where}: token_weight is {s.token_weight}")
        if s.old_logprobs is not None:
            if len(s.old_logprobs) != len(s.response_ids):
                raise InvalidMicroBatch(
                    f"{where}: {len(s.old_logprobs)} old_logprobs for {len(s.response_ids)} response tokens"
                )
            bad = next((j for j, v in enumerate(s.old_logprobs) if not (math.isfinite(v) and v <= 0.0)), None)
            if bad is not None:
                raise InvalidMicroBatch(f"{where}: old_logprobs[{bad}] = {s.old_logprobs[bad]} is not a log-probability")
        bad_id = next((t for t in (*s.prompt_ids, *s.response_ids) if not 0 <= t < vocab_size), None)
        if bad_id is not None:
            raise InvalidMicroBatch(f"{where}: token id {bad_id} is outside the vocabulary [0, {vocab_size})")


def split_for_ranks(samples: Sequence[TrainSample], num_ranks: int) -> list[list[int]]:
    """Indices of `samples` for each data-parallel rank, balancing tokens (longest first, to the
    lightest rank).  Deterministic, so every rank computes the same split."""
    order = sorted(range(len(samples)), key=lambda i: (-(len(samples[i].prompt_ids) + len(samples[i].response_ids)), i))
    loads = [0] * num_ranks
    parts: list[list[int]] = [[] for _ in range(num_ranks)]
    for i in order:
        r = min(range(num_ranks), key=lambda k: (loads[k], k))
        parts[r].append(i)
        loads[r] += len(samples[i].prompt_ids) + len(samples[i].response_ids)
    return [sorted(p) for p in parts]


def padded_width(samples: Sequence[TrainSample], pad_multiple: int) -> int:
    """Columns of `pack(samples)`: the longest row (prompt + response - 1), rounded up to pad_multiple."""
    longest = max(len(s.prompt_ids) + len(s.response_ids) - 1 for s in samples)
    return -(-longest // pad_multiple) * pad_multiple


def padded_chunks(samples: Sequence[TrainSample], max_tokens: int | None, *,
                  pad_multiple: int = 1) -> list[list[TrainSample]]:
    """`samples` in forwards of at most `max_tokens` padded tokens each (rows x the padded longest
    row, the prompt included); a row longer than that goes alone.  The micro-batch is budgeted by
    response tokens, so many short responses beside one long one pad to far more than the budget;
    since the loss is a sum, the chunks' gradients add up to the micro-batch's.  One chunk, in the
    given order, when everything fits (or `max_tokens` is None); otherwise longest first, so each
    chunk pads to its own first row.  Deterministic: every rank computes the same chunks."""
    if max_tokens is None or len(samples) * padded_width(samples, pad_multiple) <= max_tokens:
        return [list(samples)]
    chunks: list[list[TrainSample]] = []
    width = 0
    for s in sorted(samples, key=lambda s: -(len(s.prompt_ids) + len(s.response_ids))):
        if not chunks or (len(chunks[-1]) + 1) * width > max_tokens:
            chunks.append([])
            width = padded_width([s], pad_multiple)
        chunks[-1].append(s)
    return chunks


@frozen
class PackedBatch:
    """Right-padded tensors of one rank's samples.  Position t predicts token t + 1."""

    input_ids: Any
    """[B, L] long: prompt + response without its last token, padded with 0."""
    targets: Any
    """[B, L] long: the token each position predicts (0 where masked)."""
    mask: Any
    """[B, L] bool: the position predicts a response token."""
    weights: Any
    """[B, L] float: token_weight of the row at response positions, else 0."""
    advantages: Any
    """[B, 1] float."""
    old_logprobs: Any
    """[B, L] float: rollout log-probs at response positions (0 elsewhere or when unknown)."""
    has_old: Any
    """[B, 1] bool: the row's old log-probs were given (else the current policy is the old one)."""


def pack(samples: Sequence[TrainSample], *, pad_multiple: int, device: Any) -> PackedBatch:
    import torch

    lengths = [len(s.prompt_ids) + len(s.response_ids) - 1 for s in samples]
    width = -(-max(lengths) // pad_multiple) * pad_multiple
    n = len(samples)
    input_ids = torch.zeros(n, width, dtype=torch.long)
    targets = torch.zeros(n, width, dtype=torch.long)
    mask = torch.zeros(n, width, dtype=torch.bool)
    old = torch.zeros(n, width, dtype=torch.float32)
    for row, s in enumerate(samples):
        seq = torch.tensor((*s.prompt_ids, *s.response_ids), dtype=torch.long)
        p, r = len(s.prompt_ids), len(s.response_ids)
        input_ids[row, : p + r - 1] = seq[:-1]
        targets[row, p - 1 : p + r - 1] = seq[p:]
        mask[row, p - 1 : p + r - 1] = True
        if s.old_logprobs is not None:
            old[row, p - 1 : p + r - 1] = torch.tensor(s.old_logprobs, dtype=torch.float32)
    row_weight = torch.tensor([s.token_weight for s in samples], dtype=torch.float32)[:, None]
    return PackedBatch(
        input_ids=input_ids.to(device),
        targets=targets.to(device),
        mask=mask.to(device),
        weights=(mask * row_weight).to(device),
        advantages=torch.tensor([s.advantage for s in samples], dtype=torch.float32)[:, None].to(device),
        old_logprobs=old.to(device),
        has_old=torch.tensor([s.old_logprobs is not None for s in samples])[:, None].to(device),
    )


def token_logprobs_and_entropy(logits: Any, targets: Any) -> tuple[Any, Any]:
    """log p(target) and the entropy of each position's distribution, in float32."""
    import torch

    logp_all = torch.log_softmax(logits.float(), dim=-1)
    logp = logp_all.gather(-1, targets[..., None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def response_positions(mask: Any) -> Any:
    """The flat indices of a [B, L] mask's True positions (those that predict a response token)."""
    return mask.reshape(-1).nonzero().squeeze(1)


def at_positions(values: Any, index: Any, shape: Any) -> Any:
    """A tensor of `shape` holding `values` at the flat `index` and 0 elsewhere (differentiable in
    `values`): the inverse of selecting `index` from a flattened tensor."""
    return values.new_zeros(shape.numel()).index_copy(0, index, values).view(shape)


def chunked_token_logprobs_and_entropy(hidden: Any, weight: Any, targets: Any, *, chunk_tokens: int,
                                       mask: Any = None) -> tuple[Any, Any]:
    """`token_logprobs_and_entropy(hidden @ weight.T, targets)` computed `chunk_tokens` positions at a
    time.  hidden [B, L, H], weight [V, H] (the LM head), targets [B, L] -> two [B, L] float32.  With a
    [B, L] bool `mask`, only its True positions are projected; the others are 0."""
    import torch
    from torch.utils.checkpoint import checkpoint

    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    rows, flat_targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    index = None if mask is None else response_positions(mask)
    if index is not None:
        rows, flat_targets = rows.index_select(0, index), flat_targets.index_select(0, index)
    parts = [
        checkpoint(_projected_logprobs, rows[i : i + chunk_tokens], weight, flat_targets[i : i + chunk_tokens], use_reentrant=False)
        for i in range(0, max(rows.shape[0], 1), chunk_tokens)
    ]
    logp, entropy = (torch.cat(p) for p in zip(*parts))
    if index is None:
        return logp.view(targets.shape), entropy.view(targets.shape)
    return at_positions(logp, index, targets.shape), at_positions(entropy, index, targets.shape)


def _projected_logprobs(rows: Any, weight: Any, targets: Any) -> tuple[Any, Any]:
    return token_logprobs_and_entropy(rows @ weight.T, targets)


def grpo_token_loss(
    logp: Any,
    old_logp: Any,
    advantages: Any,
    *,
    clip_low: float,
    clip_high: float,
    ref_logp: Any = None,
    kl_coef: float = 0.0,
) -> tuple[Any, Any]:
    """Per-token loss and a bool tensor of tokens whose ratio was clipped (the min took the
    clipped branch)."""
    import torch

    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    if ref_logp is not None and kl_coef > 0.0:
        delta = ref_logp - logp
        loss = loss + kl_coef * (torch.exp(delta) - delta - 1.0)
    return loss, (clipped < unclipped).detach()
