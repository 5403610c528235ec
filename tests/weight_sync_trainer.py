"""A trainer process that joins the servers' weight-sync group, syncs perturbed weights once, prints
`SYNCED <group name>` and waits to be killed (a trainer that dies without leaving its group)."""

from __future__ import annotations

import argparse
import time

import torch

from rollpacker.backends.sglang.client import SGLangEngine
from rollpacker.backends.trainer.pytorch import TorchTrainer, TorchTrainerConfig
from rollpacker.driver import sync_weights


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--group", default=None, help="the group's name (default: a new one per start)")
    parser.add_argument("--urls", nargs="+", required=True)
    args = parser.parse_args()
    trainer = TorchTrainer(TorchTrainerConfig(model_dir=args.model, device="cpu", dtype="float32"))
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.1)
    engine = SGLangEngine(args.urls)
    engine.use_distributed_sync(backend="gloo", bucket_bytes=1 << 20, group_name=args.group)
    sync_weights(engine, trainer, version=1)
    print("SYNCED", engine._distributed.group_name, flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
