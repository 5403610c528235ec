"""Weight sync to two `rollpacker serve` servers on 127.0.0.1: disk (safetensors in a folder, then
/update_weights_from_disk) against the bucketed distributed path (gloo on CPU standing in for NCCL),
from the plain PyTorch trainer.  Prints a Markdown table: bytes per server, seconds, seconds per GB.

    python benchmarks/weight_sync.py                       # SmolLM2-135M-Instruct, fp32
    python benchmarks/weight_sync.py --model DIR --repeats 3 --buckets-mb 512 64

Every sync sends the whole model to each server.  Times include pausing and resuming generation.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time

import torch

from rollpacker.backends.models import resolve_model
from rollpacker.backends.sglang.client import SGLangEngine
from rollpacker.backends.sglang.launch import launch_servers
from rollpacker.backends.trainer.pytorch import TorchTrainer, TorchTrainerConfig
from rollpacker.driver import sync_weights


def model_bytes(trainer) -> int:
    return sum(p.numel() * p.element_size() for p in trainer.model.parameters())


def timed(engine, trainer, version: int) -> float:
    started = time.monotonic()
    sync_weights(engine, trainer, version)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="HF model directory (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--buckets-mb", type=int, nargs="+", default=[512, 64])
    args = parser.parse_args()
    model = str(resolve_model(args.model))
    trainer = TorchTrainer(TorchTrainerConfig(model_dir=model, device="cpu", dtype="float32"))
    nbytes = model_bytes(trainer)
    rows = []
    version = 0
    with launch_servers(model, num_servers=2, kind="rollpacker", extra_args=("--capacity", "4"), timeout_s=300) as group:
        with tempfile.TemporaryDirectory() as shared:
            with SGLangEngine(group.urls, weights_dir=shared) as engine:
                for _ in range(args.repeats):
                    version += 1
                    rows.append(("disk (safetensors, both servers load)", "-", 1, timed(engine, trainer, version)))
        for mb in args.buckets_mb:
            with SGLangEngine(group.urls) as engine:
                engine.use_distributed_sync(backend="gloo", bucket_bytes=mb * 2**20, group_name=f"bench{mb}")
                for _ in range(args.repeats):
                    version += 1
                    seconds = timed(engine, trainer, version)
                    rows.append(("distributed (gloo broadcast)", mb, engine.last_sync.num_buckets, seconds))
    print(f"model {os.path.basename(model)}: {nbytes / 1e6:.1f} MB fp32 per server, 2 servers; "
          f"{platform.machine()} {os.cpu_count()} CPU cores, torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    print("| path | bucket MB | buckets | seconds | s per GB (per server) |")
    print("| --- | --- | --- | --- | --- |")
    for path, mb, num_buckets, seconds in rows:
        print(f"| {path} | {mb} | {num_buckets} | {seconds:.2f} | {seconds / (nbytes / 1e9):.2f} |")


if __name__ == "__main__":
    main()
