"""The `rollpacker advise` example of docs/advise.md: a veRL rollout dump written from a simulated sync run's
lengths (servegen-r1, P=128 R=8, 8k cap, 8 steps; benchmarks/advise_dumps.py), for advise to read back.

    .venv/bin/python benchmarks/advise_example.py /tmp/advise-example     # writes /tmp/advise-example/dump
    rollpacker advise /tmp/advise-example/dump --gpus 16 --model 7b --max-tokens 8192 --out /tmp/advise-example/out
"""

from __future__ import annotations

import argparse
from pathlib import Path

from advise_dumps import sync_lengths, write_verl_dump
from rollpacker.sim import SimConfig

P, R, CAP, GPUS, STEPS = 128, 8, 8192, 16, 8


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    folder = ap.parse_args().folder
    config = SimConfig(workload="servegen-r1", policy="sync", prompts=P, samples=R, max_tokens=CAP, epochs=1,
                       dataset_prompts=STEPS * P, instances=GPUS, model="qwen2.5-7b")
    workload, _ = sync_lengths(config)
    print(write_verl_dump(workload, CAP, folder / "dump"))


if __name__ == "__main__":
    main()
