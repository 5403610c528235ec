"""Checks of the TorchTitan trainer (or, with --trainer torch, the plain PyTorch one), run under
torchrun (or plain python: a world of one).

    python -m torch.distributed.run --nproc_per_node=2 tests/titan_dist_check.py \
        --model-dir DIR --dp-shard 2 --tp 1 --out result.json --ckpt CKPT --phase train

Phase `train` measures, against a transformers model of the same checkpoint as the reference:
the full-batch loss and gradients; streamed micro-batches vs one full-batch backward; the loss
over a few optimizer steps on a fixed batch; export -> transformers logits vs TorchTitan logits.
It then saves a checkpoint, records the next two steps' losses and exits without cleanup (as if
killed).  Phase `resume` loads that checkpoint in a fresh process and records the same losses.
Rank 0 writes the figures as JSON; tests/test_titan_dist.py asserts on them.

With --cases FILE (a JSON list of {"model_dir", "dp_shard", "tp", "ckpt", "out", "trainer"}), one
launch checks several layouts of the same world in turn, each with its own trainer, checkpoint and
JSON, in one process group (a resume launch loads each case's checkpoint in the same order).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys

import torch

from rollpacker.backends.titan.trainer import TitanTrainer
from rollpacker.backends.titan.config import TitanConfig
from rollpacker.backends.trainer.pytorch import TorchTrainer, TorchTrainerConfig
from rollpacker.backends.trainer.loss import grpo_token_loss, pack, token_logprobs_and_entropy
from rollpacker.core.protocols import MicroBatch, TrainSample

LR = 3e-4
NUM_STEPS = 4


def make_samples(vocab: int, ref_model) -> list[TrainSample]:
    """Five samples of mixed lengths; three carry rollout log-probs (the reference policy's,
    perturbed so that some ratios leave the clip range), two leave them to the trainer."""
    rng = random.Random(1234)
    shapes = [(5, 9), (3, 4), (7, 12), (4, 1), (6, 7)]
    advantages = [1.0, -0.5, 0.75, -1.25, 0.4]
    samples = []
    for k, ((p, r), adv) in enumerate(zip(shapes, advantages)):
        prompt = tuple(rng.randrange(vocab) for _ in range(p))
        response = tuple(rng.randrange(vocab) for _ in range(r))
        sample = TrainSample(prompt, response, adv, token_weight=1.0 + 0.25 * k)
        if k < 3:
            logp = _hf_logprobs(ref_model, [sample])[0]
            old = tuple(min(-1e-4, v + rng.uniform(-0.3, 0.3)) for v in logp)
            sample = TrainSample(prompt, response, adv, sample.token_weight, old_logprobs=old)
        samples.append(sample)
    return samples


def _hf_logprobs(model, samples):
    packed = pack(samples, pad_multiple=1, device="cpu")
    with torch.no_grad():
        logp, _ = token_logprobs_and_entropy(model(packed.input_ids).logits, packed.targets)
    return [logp[i][packed.mask[i]].tolist() for i in range(len(samples))]


def hf_reference(model, samples, clip_eps: float) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and gradients of the same GRPO objective computed on the transformers model."""
    model.zero_grad(set_to_none=True)
    packed = pack(samples, pad_multiple=1, device="cpu")
    logp, _ = token_logprobs_and_entropy(model(packed.input_ids).logits, packed.targets)
    old = torch.where(packed.has_old, packed.old_logprobs, logp.detach())
    token_loss, _ = grpo_token_loss(logp, old, packed.advantages, clip_low=clip_eps, clip_high=clip_eps)
    loss = (token_loss * packed.weights).sum()
    loss.backward()
    # Tied: named_parameters lists the shared matrix once, as model.embed_tokens.weight.
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.item(), grads


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    if set(a) != set(b):
        raise AssertionError(f"tensor names differ: {sorted(set(a) ^ set(b))}")
    return max((a[k] - b[k]).abs().max().item() for k in a)


def max_abs(a: dict[str, torch.Tensor]) -> float:
    return max(v.abs().max().item() for v in a.values())


def policy_logits(trainer, ids: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    with torch.no_grad():
        if isinstance(trainer, TorchTrainer):  # the HF model inside; FSDP's root gathered by hand
            root = trainer.model
            if hasattr(root, "unshard"):
                root.unshard()
            out = root.hf(ids).logits
            if hasattr(root, "reshard"):
                root.reshard()
            return out
        out = trainer.model(ids)
    return out.full_tensor() if isinstance(out, DTensor) else out


def build_trainer(args):
    if args.trainer == "torch":
        return TorchTrainer(TorchTrainerConfig(model_dir=args.model_dir, lr=LR, max_grad_norm=None, logits_chunk_tokens=7))
    return TitanTrainer(TitanConfig(model_dir=args.model_dir, dp_shard=args.dp_shard, tp=args.tp, lr=LR, max_grad_norm=None))


def two_more_steps(trainer, batch: MicroBatch, normalizer: float) -> list[float]:
    first = trainer.forward_backward(batch).loss_sum
    trainer.optimizer_step(normalizer)
    second = trainer.forward_backward(batch).loss_sum
    trainer.discard_gradients()
    return [first, second]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir")
    ap.add_argument("--dp-shard", type=int, default=-1)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--out")
    ap.add_argument("--ckpt")
    ap.add_argument("--phase", choices=("train", "resume"), default="train")
    ap.add_argument("--trainer", choices=("titan", "torch"), default="titan")
    ap.add_argument("--cases", help="a JSON file: a list of cases (the flags above, less --phase) run in turn")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.cases:
        with open(args.cases) as f:
            cases = [argparse.Namespace(**{"dp_shard": -1, "tp": 1, "trainer": "titan", **case}) for case in json.load(f)]
    elif not (args.model_dir and args.out and args.ckpt):
        ap.error("--model-dir, --out and --ckpt are required (or --cases)")
    else:
        cases = [args]
    dist = torch.distributed
    for case in cases:
        run_case(case, args.phase)
    if dist.is_initialized():
        dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # as if killed: no process-group teardown, no destructor


def run_case(args, phase: str) -> None:
    """One layout's checks (its trainer, checkpoint and JSON); the trainer is dropped afterwards."""
    from transformers import AutoModelForCausalLM

    trainer = build_trainer(args)
    hf = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    samples = make_samples(trainer.vocab_size, hf)
    full = MicroBatch(tuple(samples))
    normalizer = float(sum(len(s.response_ids) for s in samples))
    dist = torch.distributed
    world, rank = (dist.get_world_size(), dist.get_rank()) if dist.is_initialized() else (1, 0)
    result: dict = {"world_size": world, "dp_shard": trainer.dp_size, "tp": args.tp}

    if phase == "train":
        # 1. Full batch vs the transformers reference.
        stats = trainer.forward_backward(full)
        grads_full = trainer.gradients()
        trainer.discard_gradients()
        ref_loss, ref_grads = hf_reference(hf, samples, trainer.config.clip_eps)
        result.update(
            loss=stats.loss_sum,
            ref_loss=ref_loss,
            loss_abs_diff=abs(stats.loss_sum - ref_loss),
            grad_max_abs_diff=max_abs_diff(grads_full, ref_grads),
            grad_max_abs=max_abs(ref_grads),
            num_tokens=stats.num_tokens,
            clip_fraction=stats.clip_fraction,
            entropy_sum=stats.entropy_sum,
        )
        # 2. Streamed micro-batches (one at a time, uneven sizes) vs one full-batch backward.
        streamed_loss = 0.0
        for chunk in (samples[0:2], samples[2:3], samples[3:5]):
            streamed_loss += trainer.forward_backward(MicroBatch(tuple(chunk))).loss_sum
        result.update(
            stream_grad_max_abs_diff=max_abs_diff(trainer.gradients(), grads_full),
            stream_loss_abs_diff=abs(streamed_loss - stats.loss_sum),
        )
        # 3. A few optimizer steps on the fixed batch (the streamed gradients are step 1's).
        embed_before = trainer.export_weights()["model.embed_tokens.weight"]
        losses = [streamed_loss]
        trainer.optimizer_step(normalizer)
        for _ in range(NUM_STEPS - 1):
            losses.append(trainer.forward_backward(full).loss_sum)
            trainer.optimizer_step(normalizer)
        losses.append(trainer.forward_backward(full).loss_sum)
        trainer.discard_gradients()
        result["losses"] = losses
        # 4. Export -> transformers logits vs the trained TorchTitan model's logits.
        exported = trainer.export_weights()
        result["embed_update_max_abs"] = (exported["model.embed_tokens.weight"] - embed_before).abs().max().item()
        missing, unexpected = hf.load_state_dict(exported, strict=False)
        result["export_missing"] = [k for k in missing if not (k == "lm_head.weight" and hf.config.tie_word_embeddings)]
        result["export_unexpected"] = list(unexpected)
        probe = torch.tensor([[s % trainer.vocab_size for s in range(3, 3 + 16)], [7] * 16])
        with torch.no_grad():
            hf_logits = hf(probe).logits
        result["export_logits_max_abs_diff"] = (hf_logits - policy_logits(trainer, probe)).abs().max().item()
        # 5. Save, then the next two steps' losses; exit without cleanup.
        trainer.save(args.ckpt)
        result["step_at_save"] = trainer.step
        result["next_losses"] = two_more_steps(trainer, full, normalizer)
    else:
        trainer.load(args.ckpt)
        result["step_at_load"] = trainer.step
        result["next_losses"] = two_more_steps(trainer, full, normalizer)

    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    if dist.is_initialized():
        dist.barrier()


if __name__ == "__main__":
    main()
