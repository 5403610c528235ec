"""Batched sampling and speculative verification for the embedded engine, on CPU or CUDA.

Theory of operation
    Every random number is a counter-based hash of (request seed, token index, stream), not the
    state of a generator: `uniforms` is a pure function, so a row's draws do not depend on which
    other rows share its batch, on the device, or on how many forwards produced its tokens.  All
    rows are sampled at once (no Python loop over rows, no GPU->CPU sync inside these functions).

    A row's target distribution at each position is softmax(logits / T) cut to the top-p nucleus
    and to the top-k tokens (temperature 0: the argmax); the token is drawn by inverse CDF with stream 0's uniform at its
    token index.  The reported log-prob is log_softmax(logits / T) of the token before the nucleus
    cut (the policy a trainer recomputes).

    Verifying k draft tokens d_1..d_k (one forward gave logits for positions 0..k): position j's
    token x_j is drawn exactly as a plain decode step would draw it (same distribution, same
    uniform), the draft is accepted while x_j == d_j, and the first mismatch emits x_j as the
    correction (all matched: x_k is the bonus token).  This is the speculative-sampling rule of
    Leviathan et al. / Chen et al. (2023) for a deterministic draft: d_j is accepted with
    probability p_j(d_j) = min(1, p_j(d_j) / q(d_j)) with q the point mass, and on rejection x_j
    follows p_j conditioned on x_j != d_j, which is the residual norm(max(0, p_j - q)).  So the
    emitted tokens follow the model exactly, and, because the uniforms are the plain step's, a
    seeded request emits the very same tokens with or without speculation.
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    """murmur3's finaliser on the low 32 bits (int64 arithmetic; products wrap, low bits stay)."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & _MASK32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & _MASK32
    return x ^ (x >> 16)


def uniforms(seeds: torch.Tensor, counters: torch.Tensor, stream: int = 0) -> torch.Tensor:
    """Uniforms in (0, 1), float64 `[B, T]`, from `seeds` `[B]` and `counters` `[B, T]`."""
    seeds = seeds.view(-1, 1)
    h = _fmix32(seeds ^ 0x9E3779B9)
    h = _fmix32(h ^ ((seeds >> 32) & _MASK32))
    h = _fmix32(h + stream * 0x165667B1)
    h = _fmix32(h + (counters & _MASK32) * 0x27D4EB2F)
    h = _fmix32(h ^ ((counters >> 32) & _MASK32))
    return (h.double() + 0.5) / 4294967296.0


def target_probs(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor | None,
                 top_k: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(nucleus- and top-k-cut probabilities, log_softmax(logits / T)) for logits `[B, ..., V]`;
    rows with temperature 0 use T = 1 here (their token is the argmax).  `top_p` / `top_k` (`[B]`,
    a row with k >= V keeps every token) None: no row cuts."""
    shape = (-1,) + (1,) * (logits.dim() - 1)
    t = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).view(shape)
    logp = torch.log_softmax(logits.float() / t, dim=-1)
    probs = logp.exp()
    if top_p is None and top_k is None:
        return probs, logp
    sorted_p, order = probs.sort(dim=-1, descending=True)
    drop = torch.zeros_like(sorted_p, dtype=torch.bool)
    if top_p is not None:  # keep a token if the mass strictly before it is below top_p (the first always stays)
        drop |= (sorted_p.cumsum(-1) - sorted_p) >= top_p.view(shape).to(sorted_p.dtype)
    if top_k is not None:  # keep the k most likely
        drop |= torch.arange(sorted_p.shape[-1], device=sorted_p.device) >= top_k.view(shape)
    probs = torch.zeros_like(probs).scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
    return probs, logp


def _draw(logits, temperature, top_p, seeds, counters, top_k=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token and log-prob at every position of logits `[B, T, V]`; counters `[B, T]`."""
    probs, logp = target_probs(logits, temperature, top_p, top_k)
    cdf = probs.cumsum(dim=-1)
    total = cdf[..., -1]
    # u rounds to 1.0 in float32 about once in 2^25 draws: keep u * total strictly below the total,
    # else searchsorted lands past the last kept token (on a token outside the nucleus)
    below_total = torch.nextafter(total, torch.zeros_like(total))
    u = torch.minimum(uniforms(seeds, counters, 0).to(cdf.dtype) * total, below_total)
    drawn = torch.searchsorted(cdf, u.unsqueeze(-1), right=True).squeeze(-1).clamp_(max=cdf.shape[-1] - 1)
    tokens = torch.where((temperature > 0).view(-1, 1), drawn, logits.argmax(dim=-1))
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor | None,
           seeds: torch.Tensor, counters: torch.Tensor,
           top_k: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row from logits `[B, V]`: (tokens `[B]`, log-probs `[B]`)."""
    tokens, logprobs = _draw(logits.unsqueeze(1), temperature, top_p, seeds, counters.view(-1, 1), top_k)
    return tokens[:, 0], logprobs[:, 0]


def verify(logits: torch.Tensor, drafts: torch.Tensor, num_drafts: torch.Tensor, temperature: torch.Tensor,
           top_p: torch.Tensor | None, seeds: torch.Tensor, counters: torch.Tensor,
           top_k: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Verify `drafts` `[B, K]` (the first `num_drafts[b]` of row b are real) against logits
    `[B, K+1, V]`.  Returns (tokens `[B, K+1]`, log-probs `[B, K+1]`, accepted `[B]`): row b emits
    `tokens[b, : accepted[b] + 1]`."""
    k = drafts.shape[1]
    offsets = torch.arange(k + 1, device=logits.device)
    tokens, logprobs = _draw(logits, temperature, top_p, seeds, counters.view(-1, 1) + offsets, top_k)
    is_real = offsets[:k].view(1, -1) < num_drafts.view(-1, 1)
    matched = (tokens[:, :k] == drafts) & is_real
    accepted = matched.long().cumprod(dim=-1).sum(dim=-1)
    return tokens, logprobs, accepted
