"""Forward+backward tokens/s of the reference trainer's trainer, in a process of its own (the campaign's
`trainer` part runs it, so its memory is freed on exit):

    python benchmarks/trainer_worker.py '{"model": null, "trainer": "torch", "device": "cuda", "dtype": "bfloat16",
                                          "batch": 8, "prompt": 256, "response": 768, "iters": 5}'

Prints one JSON line: the spec, the trainer's class, tokens/s (median and best) and each forward+backward's seconds.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def trainer_worker(spec: dict) -> dict:
    import random

    import torch

    from rollpacker.backends.models import resolve_model
    from rollpacker.core.protocols import MicroBatch, TrainSample
    from rollpacker.train.config import RunConfig
    from rollpacker.train.session import build_trainer

    config = RunConfig(model=spec["model"], trainer=spec["trainer"], device=spec["device"], dtype=spec["dtype"], lr=1e-6)
    trainer = build_trainer(config, resolve_model(spec["model"]))
    vocab, rng = trainer.vocab_size, random.Random(0)
    sync = torch.cuda.synchronize if spec["device"] == "cuda" else (lambda: None)

    def micro_batch() -> MicroBatch:
        ids = lambda n: tuple(rng.randrange(vocab) for _ in range(n))  # noqa: E731
        return MicroBatch(tuple(TrainSample(ids(spec["prompt"]), ids(spec["response"]), rng.uniform(-1, 1), 1.0)
                                for _ in range(spec["batch"])))

    trainer.forward_backward(micro_batch())  # warm-up
    times = []
    for _ in range(spec["iters"]):
        batch = micro_batch()
        sync()
        start = time.perf_counter()
        trainer.forward_backward(batch)
        sync()
        times.append(time.perf_counter() - start)
    tokens = spec["batch"] * (spec["prompt"] + spec["response"])
    best, median = min(times), sorted(times)[len(times) // 2]
    return {**spec, "trainer_class": type(trainer).__name__, "tokens_per_s": round(tokens / median, 1),
            "best_tokens_per_s": round(tokens / best, 1), "fwd_bwd_s": [round(t, 3) for t in times]}


if __name__ == "__main__":
    print(json.dumps(trainer_worker(json.loads(sys.argv[1]))))
