"""The trainer-agnostic GRPO pieces both trainers use (rollpacker.backends.trainer.loss): bad input
refused with errors that name what is wrong, the token loss against hand-computed values, the
data-parallel split, packing, and the chunked log-probs against the unchunked ones (values and
gradients).  No TorchTitan needed."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from rollpacker.backends.errors import InvalidMicroBatch  # noqa: E402
from rollpacker.backends.trainer.loss import (  # noqa: E402
    check_micro_batch,
    chunked_token_logprobs_and_entropy,
    grpo_token_loss,
    pack,
    split_for_ranks,
    token_logprobs_and_entropy,
)
from rollpacker.core.protocols import MicroBatch, TrainSample  # noqa: E402


def ok_sample(**kw) -> TrainSample:
    args = dict(prompt_ids=(1, 2), response_ids=(3, 4, 5), advantage=0.5, token_weight=1.0)
    args.update(kw)
    return TrainSample(**args)


@pytest.mark.parametrize(
    "sample, message",
    [
        (ok_sample(response_ids=()), "sample 0 has no response tokens"),
        (ok_sample(prompt_ids=()), "sample 0 has an empty prompt"),
        (ok_sample(old_logprobs=(-0.1, -0.2)), "sample 0: 2 old_logprobs for 3 response tokens"),
        (ok_sample(advantage=float("nan")), "sample 0: advantage is nan"),
        (ok_sample(token_weight=float("inf")), "sample 0: token_weight is inf"),
        (ok_sample(old_logprobs=(-0.1, float("nan"), -0.3)), "old_logprobs[1] = nan"),
        (ok_sample(old_logprobs=(-0.1, 0.5, -0.3)), "old_logprobs[1] = 0.5 is not a log-probability"),
        (ok_sample(response_ids=(3, 999)), "token id 999 is outside the vocabulary"),
        (ok_sample(response_ids=tuple(range(3, 40))), "exceed max_seq_len 16"),
    ],
)
def test_bad_micro_batch_is_refused(sample: TrainSample, message: str) -> None:
    with pytest.raises(InvalidMicroBatch, match=message.replace("[", r"\[").replace("]", r"\]")):
        check_micro_batch(MicroBatch((sample,)), vocab_size=100, max_seq_len=16)


def test_empty_micro_batch_is_refused() -> None:
    with pytest.raises(InvalidMicroBatch, match="no samples"):
        check_micro_batch(MicroBatch(()), vocab_size=100, max_seq_len=16)


def test_grpo_loss_matches_hand_computation() -> None:
    logp = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.9)]])
    old = torch.tensor([[math.log(0.25), math.log(0.3), math.log(0.9 / 0.5)]])  # ratios 2, 1, 0.5
    for adv, expected, clipped in [
        # A > 0: -min(r A, clip(r) A) -> ratio 2 clipped to 1.2; ratio 0.5 stays (min takes it).
        (1.0, [-1.2, -1.0, -0.5], [True, False, False]),
        # A < 0: ratio 0.5 clipped to 0.8 (min of -0.5A... takes the clipped branch); ratio 2 stays.
        (-1.0, [2.0, 1.0, 0.8], [False, False, True]),
    ]:
        loss, was_clipped = grpo_token_loss(logp, old, torch.tensor([[adv]]), clip_low=0.2, clip_high=0.2)
        assert loss[0].tolist() == pytest.approx(expected, abs=1e-6)
        assert was_clipped[0].tolist() == clipped


def test_kl_term_is_k3_estimator() -> None:
    logp = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])
    loss, _ = grpo_token_loss(logp, logp, torch.tensor([[0.0]]), clip_low=0.2, clip_high=0.2, ref_logp=ref, kl_coef=0.1)
    delta = math.log(0.25) - math.log(0.5)
    assert loss.item() == pytest.approx(0.1 * (math.exp(delta) - delta - 1.0), abs=1e-7)


def test_split_for_ranks_covers_every_sample_once_and_balances_tokens() -> None:
    samples = [ok_sample(response_ids=tuple(range(3, 3 + n))) for n in (9, 1, 7, 3, 5, 2)]
    parts = split_for_ranks(samples, 3)
    assert sorted(i for p in parts for i in p) == list(range(6))
    loads = [sum(len(samples[i].prompt_ids) + len(samples[i].response_ids) for i in p) for p in parts]
    assert max(loads) - min(loads) <= 3
    assert split_for_ranks(samples[:1], 2) == [[0], []]  # a rank may get nothing (it runs a zero-weight pass)


def test_pack_aligns_targets_with_response_tokens() -> None:
    packed = pack([ok_sample(), ok_sample(prompt_ids=(7,), response_ids=(8,), token_weight=2.0)], pad_multiple=4, device="cpu")
    assert packed.input_ids.shape == (2, 4)
    assert packed.input_ids[0].tolist() == [1, 2, 3, 4]
    assert packed.targets[0].tolist() == [0, 3, 4, 5] and packed.mask[0].tolist() == [False, True, True, True]
    assert packed.targets[1].tolist() == [8, 0, 0, 0] and packed.weights[1].tolist() == [2.0, 0.0, 0.0, 0.0]


def _head_problem(dtype, seed=0, shape=(3, 7, 16), vocab=50):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(*shape, generator=g, dtype=dtype, requires_grad=True)
    weight = torch.randn(vocab, shape[-1], generator=g, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, vocab, shape[:2], generator=g)
    return hidden, weight, targets


def _values_and_grads(fn, hidden, weight, targets):
    logp, entropy = fn(hidden, weight, targets)
    # Weights that differ per position, so a misplaced chunk would change the gradients.
    coef = torch.linspace(-1.0, 2.0, logp.numel()).view(logp.shape)
    (logp * coef + 0.3 * entropy).sum().backward()
    out = (logp.detach(), entropy.detach(), hidden.grad.clone(), weight.grad.clone())
    hidden.grad = weight.grad = None
    return out


@pytest.mark.parametrize("chunk_tokens", [1, 5, 7, 21, 1000])
def test_chunked_logprobs_equal_unchunked_values_and_gradients(chunk_tokens) -> None:
    hidden, weight, targets = _head_problem(torch.float32)
    whole = _values_and_grads(lambda h, w, t: token_logprobs_and_entropy(h @ w.T, t), hidden, weight, targets)
    chunked = _values_and_grads(
        lambda h, w, t: chunked_token_logprobs_and_entropy(h, w, t, chunk_tokens=chunk_tokens), hidden, weight, targets
    )
    for name, a, b in zip(("logp", "entropy", "d hidden", "d weight"), whole, chunked):
        assert a.shape == b.shape and a.dtype == b.dtype == torch.float32, name
        assert (a - b).abs().max().item() <= 2e-6 * max(1.0, a.abs().max().item()), name


@pytest.mark.parametrize("chunk_tokens", [1, 4, 1000])
def test_masked_logprobs_project_only_the_mask_with_the_values_and_gradients_of_the_whole(chunk_tokens) -> None:
    """The loss reads response positions only: with a mask, the LM head's matmuls cover its True
    rows alone (counted by torch's FLOP counter), the values there and every gradient equal the
    unmasked computation's under the same mask, and the other positions are 0."""
    from torch.utils.flop_counter import FlopCounterMode

    hidden, weight, targets = _head_problem(torch.float32)
    mask = torch.zeros(targets.shape, dtype=torch.bool)
    mask[0, 2:], mask[1, 6:], mask[2, 3:5] = True, True, True  # 5 + 1 + 2 of 21 positions
    coef = mask.float()

    def run(use_mask: bool):
        counter = FlopCounterMode(display=False)
        with counter:
            logp, entropy = chunked_token_logprobs_and_entropy(hidden, weight, targets, chunk_tokens=chunk_tokens,
                                                               mask=mask if use_mask else None)
            ((logp * coef).sum() + 0.3 * (entropy * coef).sum()).backward()
        out = (logp.detach(), entropy.detach(), hidden.grad.clone(), weight.grad.clone())
        hidden.grad = weight.grad = None
        return out, counter.get_total_flops()

    (whole, whole_flops), (masked, masked_flops) = run(False), run(True)
    rows_flops = 2 * 16 * 50 * 4  # a row's [16] x [16, 50]: forward, its recompute, two in backward
    assert (whole_flops, masked_flops) == (21 * rows_flops, 8 * rows_flops)
    for name, a, b in zip(("logp", "entropy"), whole, masked):
        assert torch.allclose(a * coef, b, atol=1e-6) and not b[~mask].any(), name
    for name, a, b in zip(("d hidden", "d weight"), whole[2:], masked[2:]):
        assert (a - b).abs().max().item() <= 2e-6 * max(1.0, a.abs().max().item()), name


def test_chunked_logprobs_keep_one_chunk_of_logits_for_backward() -> None:
    """The autograd graph saves each chunk's inputs, not its [chunk, vocab] logits."""
    hidden, weight, targets = _head_problem(torch.float32, shape=(2, 64, 8), vocab=4096)
    saved: list[int] = []

    def pack_hook(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack_hook, lambda t: t):
        chunked_token_logprobs_and_entropy(hidden, weight, targets, chunk_tokens=16)
    assert saved and max(saved) < 16 * 4096, "a chunk's logits (or all of them) were saved for backward"


def test_chunk_tokens_must_be_positive() -> None:
    hidden, weight, targets = _head_problem(torch.float32)
    with pytest.raises(ValueError, match="chunk_tokens must be >= 1"):
        chunked_token_logprobs_and_entropy(hidden, weight, targets, chunk_tokens=0)
