"""Part 4 of benchmarks/sim_vs_real.py: the simulator's steps of a measured run (the same workload, lengths per
(prompt, sample), dataset prompt lengths, seed, policy, sizes and micro-batches, on instances of the fitted
profile), and every prediction of a kept result made again by this tree's simulator."""

from __future__ import annotations

import argparse
from pathlib import Path

import attrs
from sim_vs_real_calibrate import model_dir
from sim_vs_real_report import round_rows, streams_training

from rollpacker.core import BatcherConfig
from rollpacker.sim.config import SimConfig
from rollpacker.sim.constants import SimConstants
from rollpacker.sim.engine_profile import EngineProfile
from rollpacker.sim.simulation import Simulation


@attrs.frozen
class Workload:
    """A built-in trace and the trace tokens that map to --max-tokens."""

    name: str
    scale_from: int


def instances_of(args) -> int:
    """The engine instances a run of `args` uses: two SGLang servers, one embedded engine."""
    return 2 if args.engine == "sglang" else 1


def dataset_size(args) -> int:
    return 8 * args.prompts


def sim_constants(stages: dict, stream: bool = False) -> SimConstants:
    """The simulator's constants of the measured run: colocated training with the calibrated trainer, the
    scorer's measured latency, the live path's reward settings, no KV watermark (the engine keeps none)."""
    c = SimConstants()
    train = {k: stages[k] for k in ("micro_batch_overhead_s", "seconds_per_padded_token", "seconds_per_token",
                                    "optimizer_s")}
    return attrs.evolve(
        c, train=attrs.evolve(c.train, stream=stream, **train),
        reward=attrs.evolve(c.reward, median_s=stages["reward_median_s"], sigma=0.0, hang_rate=0.0, burst_workers=0,
                            workers=1, hedge_after=2.0, hedge_copies=1),
        engine=attrs.evolve(c.engine, admit_watermark=0.0))


# -- prediction -----------------------------------------------------------------------------------------

def predict(args, profile_path: Path, policy: str, seed: int, workload: Workload, steps: int, stages: dict,
            micro_batch_tokens: int, instances: int, profile: EngineProfile | None = None,
            simulation=Simulation) -> list[dict]:
    """Part 4: the simulator's steps of the same run (with `profile` saved as `profile_path` first, if given;
    `simulation`: the class, or a callable taking its arguments, that simulates it)."""
    from rollpacker.train.replay import ReplayOptions

    if profile is not None:
        profile.save(profile_path)

    config = SimConfig(workload=workload.name, policy=policy, prompts=args.prompts, samples=args.samples,
                       max_tokens=args.max_tokens, steps=steps, seed=seed, instances=instances,
                       dataset_prompts=dataset_size(args), scale_from=workload.scale_from,
                       engine_profile=str(profile_path), bubble_capacity=args.capacity)
    lengths = prompt_lengths(args, seed)
    replay = ReplayOptions(replay_lengths=workload.name, replay_scale_from=workload.scale_from)
    sim = simulation(config, sim_constants(stages, stream=streams_training(args)),
                     workload=replay.workload(len(lengths), lengths, seed, args.max_tokens),
                     batcher=BatcherConfig(token_budget=micro_batch_tokens))
    return sim.run()["steps"]


_PROMPTS: dict = {}


def prompt_lengths(args, seed: int) -> list[int]:
    """The token lengths of the run's dataset prompts, as the reference trainer renders them."""
    key = (args.model, seed, dataset_size(args))
    if key not in _PROMPTS:
        from rollpacker.train.config import parse
        from rollpacker.train.prompts import load_prompts

        config = parse(["--seed", str(seed), "--dataset-size", str(dataset_size(args)), "--max-tokens",
                        str(args.max_tokens), "--prompts", str(args.prompts)])
        prompts = load_prompts(config, Path(model_dir(args.model)))
        _PROMPTS[key] = [len(prompts.prompt_ids(i)) for i in range(len(prompts))]
    return _PROMPTS[key]


def repredict(result: dict, out: Path) -> dict:
    """`result` with every predicted figure made again by this tree's simulator, from the profile and stages it
    was measured with (the measured figures as they were): after a change to the latency model."""
    args = argparse.Namespace(**result["args"])
    profile_path = out / "profile.json"
    EngineProfile(**result["profile"]).save(profile_path)
    check, instances = Workload(args.workload, args.scale_from), instances_of(args)
    runs = []
    for policy, seed, rows in result["runs"]:
        sim = predict(args, profile_path, policy, seed, check, args.steps, result["stages"],
                      result["micro_batch_tokens"], instances)
        runs.append((policy, seed, [{**row, **{k: (row[k][0], v[k][1]) for k in v if k in MEASURED_PAIRS and k in row},
                                     "sim_round": v["sim_round"]}
                                    for row, v in zip(rows, round_rows(sim, sim))]))
    return {**result, "runs": runs}


MEASURED_PAIRS = ("rollout", "step_s", "train", "longest", "bubble", "wasted")
"""The (measured, predicted) pairs of a round's row."""
