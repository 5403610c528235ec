"""Writes the small fixture logs of tests/test_advise*.py, one per supported format, from the schemas the
trainers document (no downloaded data).  Run from anywhere: `python tests/data/advise/make_fixtures.py`.

Every fixture is the same small run: 4 steps, P = 4 prompts of R = 4 samples, a 256-token cap; one prompt a
step is long (its samples near or at the cap), the others short."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
STEPS, P, R, CAP = 4, 4, 4, 256


def lengths() -> dict[tuple[int, int], list[int]]:
    rng = np.random.default_rng(7)
    out = {}
    for step in range(1, STEPS + 1):
        for p in range(P):
            median = 180 if p == step % P else 24
            out[step, p] = [int(min(CAP, max(2, rng.lognormal(np.log(median), 0.5)))) for _ in range(R)]
    return out


def text(tokens: int) -> str:
    """As many tokens of the default tokenizer ("a", then " a" each one token)."""
    return "a" + " a" * (tokens - 1) if tokens > 0 else ""


def output_text(n: int) -> str:
    return text(n if n >= CAP else n - 1)  # the EOS is stripped below the cap


def verl_dump(data) -> None:
    folder = HERE / "verl_dump"
    folder.mkdir(exist_ok=True)
    for step in range(1, STEPS + 1):
        rows = [{"input": f"<|user|> question {step}.{p} <|assistant|>", "output": output_text(n), "gts": "42",
                 "score": 1.0, "step": step, "uid": f"9f1c{step}{p}aa-{p}-uid_0_{i}"}
                for p in range(P) for i, n in enumerate(data[step, p])]
        (folder / f"{step}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def scalars(data, step: int) -> dict:
    values = [n for p in range(P) for n in data[step, p]]
    return {"mean": float(np.mean(values)), "max": float(max(values)), "min": float(min(values)),
            "clip_ratio": float(np.mean([n >= CAP for n in values]))}


def verl_metrics(data) -> None:
    lines = []
    for step in range(1, STEPS + 1):
        s = scalars(data, step)
        lines.append({"step": step, "data": {
            "response_length/mean": s["mean"], "response_length/max": s["max"], "response_length/min": s["min"],
            "response_length/clip_ratio": s["clip_ratio"], "prompt_length/mean": 12.0,
            "timing_s/gen": 0.9 + 0.1 * step, "timing_s/step": 2.5 + 0.1 * step,
            "agent_loop/generate_sequences/max": 0.8 + 0.1 * step, "agent_loop/generate_sequences/mean": 0.2}})
    lines.append({"step": STEPS, "data": {"val-core/acc": 0.5}})  # a validation row: no lengths
    (HERE / "verl_metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def trl_completions(data) -> None:
    folder = HERE / "trl" / "completions"
    folder.mkdir(parents=True, exist_ok=True)
    for step in range(1, STEPS + 1):
        rows = [{"step": step, "prompt": f"Question {step}.{p}?", "completion": output_text(n),
                 "accuracy_reward": 1.0, "advantage": 0.0} for p in range(P) for n in data[step, p]]
        pd.DataFrame(rows).to_parquet(folder / f"completions_{step:05d}.parquet", index=False)


def trl_history(data) -> list[dict]:
    return [{"completions/mean_length": s["mean"], "completions/max_length": s["max"],
             "completions/min_length": s["min"], "completions/clipped_ratio": s["clip_ratio"],
             "profiling/Time taken: GRPOTrainer._generate": 1.1, "step": step, "epoch": step / STEPS}
            for step in range(1, STEPS + 1) for s in [scalars(data, step)]]


def trl_state(data) -> None:
    folder = HERE / "trl_state"
    folder.mkdir(exist_ok=True)
    history = trl_history(data) + [{"train_runtime": 12.0, "step": STEPS}]  # the end of training: no lengths
    state = {"global_step": STEPS, "logging_steps": 1, "log_history": history, "train_batch_size": 16}
    (folder / "trainer_state.json").write_text(json.dumps(state, indent=1) + "\n")


def wandb_csv(data) -> None:
    rows = [{"_step": i, "train/global_step": r["step"], **{f"train/{k}": v for k, v in r.items() if k != "step"}}
            for i, r in enumerate(trl_history(data))]
    with open(HERE / "wandb_history.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def rollpacker_metrics(data) -> None:
    lines = []
    for step in range(1, STEPS + 1):
        requests = [[p, n, "length" if n >= CAP else "stop", f"r{step}-{p}-{i}", 1.0]
                    for p in range(P) for i, n in enumerate(data[step, p])]
        lines.append({"step": step, "rollout_s": 1.0, "step_s": 2.0, "requests": requests})
    (HERE / "rollpacker_metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


if __name__ == "__main__":
    data = lengths()
    for write in (verl_dump, verl_metrics, trl_completions, trl_state, wandb_csv, rollpacker_metrics):
        write(data)
