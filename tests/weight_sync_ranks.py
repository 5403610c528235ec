"""Run under torchrun (2 ranks, gloo): an FSDP2 TorchTrainer with perturbed weights syncs them to the
`rollpacker serve` servers at --urls over the distributed path; rank 0 sends, rank 1 follows.  Rank 0
writes the servers' greedy tokens before the sync, the sync's figures, and the exported weights."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist

from rollpacker.backends.sglang.client import SGLangEngine
from rollpacker.backends.trainer.pytorch import TorchTrainer, TorchTrainerConfig
from rollpacker.driver import sync_weights
from rollpacker.train.ranks import LeaderTrainer, follow


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--bucket-bytes", type=int, required=True)
    parser.add_argument("--urls", nargs="+", required=True)
    args = parser.parse_args()
    trainer = TorchTrainer(TorchTrainerConfig(model_dir=args.model, device="cpu", dtype="float32"))
    generator = torch.Generator().manual_seed(10 + dist.get_rank())
    with torch.no_grad():  # each rank changes its own shard: the whole is whatever they make
        for p in trainer.model.parameters():
            p.to_local().add_(0.2 * torch.randn(p.to_local().shape, generator=generator))
    if dist.get_rank() != 0:
        follow(trainer)
        return
    from sglang_helpers import collect, request

    leader = LeaderTrainer(trainer)
    with SGLangEngine(args.urls) as engine:
        before = []
        for k, url in enumerate(engine.urls):
            engine.submit([request(400 + k, max_new=12)], server=url)
        results, _ = collect(engine, len(engine.urls))
        before = [list(results[f"rp{400 + k:012d}"].token_ids) for k in range(len(engine.urls))]
        engine.use_distributed_sync(backend="gloo", bucket_bytes=args.bucket_bytes, group_name="torchrun")
        sync_weights(engine, leader, version=7)
        stats = engine.last_sync
    expected = leader.export_weights()
    leader.stop()
    weights_path = Path(args.out).with_suffix(".pt")
    torch.save(expected, weights_path)
    Path(args.out).write_text(json.dumps({
        "before": before, "expected": str(weights_path), "num_bytes": stats.num_bytes,
        "num_buckets": stats.num_buckets, "seconds": stats.seconds, "s_per_gb": stats.s_per_gb,
    }))


if __name__ == "__main__":
    main()
