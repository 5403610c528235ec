"""Batched sampling and speculative verification: counter-based uniforms, the tempered nucleus
distribution, and a verify rule that is lossless (the chi-square check has the power to catch a
wrong rule: an always-accept rule fails it)."""

from __future__ import annotations

import math

import pytest
import torch
from test_embedded_speculation import chi_square_pvalue

from rollpacker.backends.embedded.sampling import sample, target_probs, uniforms, verify

N = 20000


def test_uniforms_are_deterministic_open_and_independent_of_the_batch():
    seeds = torch.arange(1000, dtype=torch.long) * 7919
    counters = torch.arange(5, dtype=torch.long).expand(1000, 5)
    u = uniforms(seeds, counters, 0)
    assert ((u > 0) & (u < 1)).all()
    perm = torch.randperm(1000)
    assert torch.equal(uniforms(seeds[perm], counters[perm], 0), u[perm])
    assert not torch.equal(uniforms(seeds, counters, 1), u)  # streams differ
    hist = torch.histc(u.float(), bins=10, min=0, max=1)
    assert (hist / u.numel() - 0.1).abs().max() < 0.01


def test_sample_greedy_nucleus_and_logprob_semantics():
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.1], [0.6, 0.3, 0.1], [0.6, 0.3, 0.1]]))
    temp, top_p = torch.tensor([0.0, 0.5, 1.0]), torch.tensor([1.0, 1.0, 0.5])
    tokens, lps = sample(logits, temp, top_p, torch.arange(3), torch.zeros(3, dtype=torch.long))
    assert tokens[0] == 0 and lps[0] == pytest.approx(math.log(0.6))  # greedy, unscaled log-prob
    assert tokens[2] == 0  # nucleus 0.5 keeps only the top token
    expect = torch.log_softmax(logits[1] / 0.5, -1)[tokens[1]]
    assert lps[1] == pytest.approx(expect.item())  # log-prob at temperature T, before the cut
    top1, lp1 = sample(logits, torch.ones(3), None, torch.arange(3) + 9, torch.zeros(3, dtype=torch.long),
                       torch.tensor([1, 1, 1]))
    assert top1.tolist() == [0, 0, 0] and lp1.tolist() == pytest.approx([math.log(0.6)] * 3)  # top_k=1: greedy


@pytest.mark.parametrize("temperature, top_p, top_k", [(1.0, None, None), (0.7, 0.8, None), (1.0, None, 2),
                                                       (1.0, 0.8, 2)])
def test_sample_follows_the_tempered_nucleus_distribution(temperature, top_p, top_k):
    logits = torch.log(torch.tensor([0.5, 0.25, 0.15, 0.07, 0.03])).expand(N, 5)
    temp = torch.full((N,), temperature)
    tp = None if top_p is None else torch.full((N,), top_p)
    tk = None if top_k is None else torch.full((N,), top_k)
    tokens, _ = sample(logits, temp, tp, torch.arange(N) * 31 + 5, torch.full((N,), 3), tk)
    probs, _ = target_probs(logits[:1], temp[:1], None if tp is None else tp[:1], None if tk is None else tk[:1])
    if top_k is not None:
        assert (probs[0] > 0).sum() == top_k and set(tokens.tolist()) == {0, 1}
    observed = {(t,): c for t, c in enumerate(torch.bincount(tokens, minlength=5).tolist())}
    probs = probs[0] / probs[0].sum()  # the nucleus, renormalised
    expected = {(t,): p for t, p in enumerate(probs.tolist())}
    assert chi_square_pvalue(observed, expected, N) > 1e-3


def _two_position_logits(drafts: torch.Tensor) -> torch.Tensor:
    """Logits [B, 2, V]: position 0 fixed; position 1 depends on the token at position 0, which
    during verification is the draft (the forward saw the draft as the next input)."""
    base0 = torch.log(torch.tensor([0.45, 0.3, 0.15, 0.1]))
    table = torch.log(torch.tensor([[0.7, 0.1, 0.1, 0.1], [0.1, 0.6, 0.2, 0.1],
                                    [0.25, 0.25, 0.25, 0.25], [0.05, 0.05, 0.1, 0.8]]))
    return torch.stack([base0.expand(len(drafts), 4), table[drafts[:, 0]]], dim=1)


def _joint_after_verify(rule) -> float:
    gen = torch.Generator().manual_seed(0)
    drafts = torch.multinomial(torch.tensor([0.1, 0.2, 0.3, 0.4]), N, replacement=True, generator=gen).view(N, 1)
    logits = _two_position_logits(drafts)
    seeds, counters = torch.arange(N) * 13 + 1, torch.zeros(N, dtype=torch.long)
    tokens, _, accepted = rule(logits, drafts, torch.ones(N, dtype=torch.long), torch.ones(N), None, seeds, counters)
    # the second token needs a second step when the draft was rejected: sample it from the
    # model given the emitted first token, with the next counter (as the engine does)
    table = _two_position_logits(tokens[:, :1])[:, 1]
    second, _ = sample(table, torch.ones(N), None, seeds, counters + 1)
    second = torch.where(accepted >= 1, tokens[:, 1], second)
    observed = {}
    for a, b in zip(tokens[:, 0].tolist(), second.tolist()):
        observed[(a, b)] = observed.get((a, b), 0) + 1
    p0 = torch.tensor([0.45, 0.3, 0.15, 0.1])
    cond = torch.softmax(_two_position_logits(torch.arange(4).view(4, 1))[:, 1], -1)
    expected = {(a, b): (p0[a] * cond[a, b]).item() for a in range(4) for b in range(4)}
    return chi_square_pvalue(observed, expected, N)


def test_verify_is_lossless_and_a_wrong_rule_is_caught():
    assert _joint_after_verify(verify) > 1e-3

    def always_accept(logits, drafts, num_drafts, *rest):
        tokens, logprobs, _ = verify(logits, drafts, num_drafts, *rest)
        tokens = torch.cat([drafts, tokens[:, 1:]], dim=1)
        return tokens, logprobs, num_drafts.clone()

    assert _joint_after_verify(always_accept) < 1e-6


def test_verify_without_drafts_is_sample_and_greedy_accepts_the_matching_prefix():
    logits = torch.randn(8, 4, 50)
    seeds, counters, temp = torch.arange(8), torch.full((8,), 2), torch.ones(8)
    tokens, lps, accepted = verify(logits, torch.zeros(8, 3, dtype=torch.long), torch.zeros(8, dtype=torch.long),
                                   temp, None, seeds, counters)
    alone, alone_lp = sample(logits[:, 0], temp, None, seeds, counters)
    assert torch.equal(tokens[:, 0], alone) and torch.allclose(lps[:, 0], alone_lp) and (accepted == 0).all()
    greedy = logits.argmax(-1)
    drafts = greedy[:, :3].clone()
    drafts[:4, 1] = (drafts[:4, 1] + 1) % 50  # rows 0-3 diverge at the second draft
    _, _, accepted = verify(logits, drafts, torch.full((8,), 3), torch.zeros(8), None, seeds, counters)
    assert accepted.tolist() == [1] * 4 + [3] * 4


def test_a_uniform_that_rounds_to_one_stays_in_the_nucleus(monkeypatch):
    import rollpacker.backends.embedded.sampling as sampling

    def almost_one(seeds, counters, stream=0):
        return torch.full(counters.shape, 1 - 2**-33, dtype=torch.float64)  # 1.0 in float32

    monkeypatch.setattr(sampling, "uniforms", almost_one)
    logits = torch.tensor([[5.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    temp, top_p = torch.tensor([1.0, 1.0]), torch.tensor([0.5, 1.0])
    tokens, _ = sampling.sample(logits, temp, top_p, torch.arange(2), torch.zeros(2, dtype=torch.long))
    assert tokens.tolist() == [0, 3]  # the nucleus's only token; without a cut, the last token
