"""`rollpacker advise` predicts what the simulator measured: a simulated sync run's per-sample lengths,
written as a veRL rollout dump (text, EOS stripped), re-imported by advise, give tail batching's gain on
the original workload within 10%."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import attrs
import numpy as np
from rollpacker.cli import main
from rollpacker.sim import SimConfig, Simulation
from rollpacker.sim.compare import STEP
from rollpacker.sim.workloads import load_workload

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from advise_dumps import sync_lengths, write_verl_dump  # noqa: E402

P, R, CAP, GPUS, STEPS, SEEDS = 16, 8, 8192, 4, 4, (0, 1)


def measured_gain(config: SimConfig) -> float:
    """Tail's whole-step gain over sync on the original workload (the dump's draws: workload seed 0), the
    median over scheduler seeds."""
    def per_batch(policy: str, seed: int) -> float:
        workload = load_workload(config.workload, num_prompts=config.dataset_prompts, seed=0,
                                 max_tokens=CAP, between=config.between)
        run = Simulation(attrs.evolve(config, policy=policy, seed=seed), workload=workload).run()
        return run["total"][STEP]
    return float(np.median([per_batch("sync", s) / per_batch("tail", s) for s in SEEDS]))


def test_a_simulated_runs_lengths_as_a_verl_dump_give_back_its_gain(tmp_path):
    config = SimConfig(workload="servegen-r1", policy="sync", prompts=P, samples=R, max_tokens=CAP, epochs=1,
                       dataset_prompts=STEPS * P, instances=GPUS, model="qwen2.5-7b")
    workload, _ = sync_lengths(config)
    dump = write_verl_dump(workload, CAP, tmp_path / "dump")
    out = tmp_path / "advice"
    assert main(["advise", str(dump), "--gpus", str(GPUS), "--model", "7b", "--max-tokens", str(CAP),
                 "--seeds", *map(str, SEEDS), "--jobs", "1", "--no-progress", "--no-plot", "--out", str(out)]) == 0
    advice = json.loads((out / "advice.json").read_text())
    assert (advice["prompts"], advice["samples"], advice["steps"]) == (P, R, list(range(STEPS)))
    # the imported lengths are the simulated ones, one for one
    imported = {(line["step"], tuple(sorted(line["lengths"])))
                for line in map(json.loads, (out / "workload.jsonl").read_text().splitlines())}
    assert imported == {(step, tuple(sorted(v))) for (step, _), v in workload.draws.items()}
    tail = next(o for o in advice["outcomes"] if o["label"] == "tail")
    predicted = float(np.median(tail["step_gain"]))
    assert abs(predicted / measured_gain(config) - 1) <= 0.10, (predicted, measured_gain(config))
