"""Speculative decoding in the embedded engine, end to end with real models: sampled outputs follow
the model's own distribution exactly (chi-square against the exact sequence probabilities, with
and without speculation), greedy output is unchanged token for token, and a seeded request gives
the same tokens whether its steps were speculative or not."""

from __future__ import annotations

import itertools
import math
import time

import pytest
import torch

from devices import DEVICES

from rollpacker.backends.embedded.engine import EmbeddedEngine
from rollpacker.core.protocols import GenerationRequest, GenerationResult

VOCAB, PROMPT, NEW = 6, (1, 2, 3, 1, 2), 4


def tiny_peaked_model(device: str = "cpu", dtype=torch.float64):
    """A 2-layer Llama with a 6-token vocabulary and large weights: peaked, prefix-dependent
    next-token distributions whose whole joint over a few tokens can be enumerated."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(3)
    model = LlamaForCausalLM(config).to(dtype)
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    return model.to(device).eval()


def exact_joint(model, prompt, num_new, temperature=1.0) -> dict[tuple[int, ...], float]:
    """P(t1..tn | prompt) for every sequence, from full forwards of every prefix."""
    probs = {}
    seqs = list(itertools.product(range(VOCAB), repeat=num_new))
    ids = torch.tensor([list(prompt) + list(s) for s in seqs], device=model.device)
    with torch.inference_mode():
        logp = torch.log_softmax(model(ids).logits.double() / temperature, -1)
    for i, s in enumerate(seqs):
        total = sum(logp[i, len(prompt) - 1 + j, t].item() for j, t in enumerate(s))
        probs[s] = math.exp(total)
    return probs


def chi_square_pvalue(observed: dict, expected_probs: dict, n: int, min_expected: float = 5.0) -> float:
    """Pearson's chi-square over the outcomes, rare outcomes pooled; Wilson-Hilferty p-value."""
    stat, pooled_o, pooled_e, df = 0.0, 0, 0.0, -1
    for outcome, p in expected_probs.items():
        e, o = p * n, observed.get(outcome, 0)
        if e < min_expected:
            pooled_o, pooled_e = pooled_o + o, pooled_e + e
            continue
        stat += (o - e) ** 2 / e
        df += 1
    if pooled_e > 0:
        stat += (pooled_o - pooled_e) ** 2 / max(pooled_e, 1e-9)
        df += 1
    z = ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


def run_all(engine, requests, timeout=300.0) -> dict[str, GenerationResult]:
    engine.submit(requests)
    results, end = {}, time.monotonic() + timeout
    while len(results) < len(requests):
        assert time.monotonic() < end, "engine did not finish in time"
        for e in engine.poll(0.5):
            if isinstance(e, GenerationResult):
                results[e.request_id] = e
    return results


def sample_sequences(model, n, *, spec_max_rows, temperature=1.0, top_p=1.0):
    with EmbeddedEngine(model, capacity=64, stop_token_ids=(), spec_max_rows=spec_max_rows,
                        spec_tokens=3, spec_ngram=2) as engine:
        reqs = [GenerationRequest(f"s{i}", PROMPT, NEW, temperature=temperature, top_p=top_p, seed=i,
                                  group="one-prompt") for i in range(n)]
        results = run_all(engine, reqs)
        stats = engine.speculation_stats
    return [results[f"s{i}"].token_ids for i in range(n)], stats


@pytest.mark.timeout(300)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spec_max_rows", [0, 64])
def test_sampled_sequences_follow_the_model_distribution(spec_max_rows, device):
    model = tiny_peaked_model(device)
    n = 6000
    seqs, stats = sample_sequences(model, n, spec_max_rows=spec_max_rows)
    observed = {}
    for s in seqs:
        observed[tuple(s)] = observed.get(tuple(s), 0) + 1
    p = chi_square_pvalue(observed, exact_joint(model, PROMPT, NEW), n)
    assert p > 1e-3, f"chi-square p = {p:.2e}: sampled sequences do not follow the model"
    if spec_max_rows:  # speculation really ran, and both accepted and rejected drafts
        assert stats.num_verify_steps > 0 and 0 < stats.num_accepted < stats.num_drafted


@pytest.mark.timeout(300)
@pytest.mark.parametrize("device", DEVICES)
def test_seeded_tokens_do_not_depend_on_speculation(device):
    model = tiny_peaked_model(device)
    off, _ = sample_sequences(model, 300, spec_max_rows=0, top_p=0.9)
    on, stats = sample_sequences(model, 300, spec_max_rows=64, top_p=0.9)
    assert stats.num_accepted > 0
    assert on == off
