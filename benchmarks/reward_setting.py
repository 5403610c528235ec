"""The reward setting the simulator and the reference trainer share, chosen by measurement: candidate
hedging and extra-worker settings at the headline's setting (32k, 64 x Qwen2.5-7B, servegen-r1 at between
0.9, P=128 R=8, an epoch of 512 prompts, ours-best and sync on the same engine as in field_table.py),
whole step per P trained, the median over seeds; writes RESULTS.md "One reward setting".

    .venv/bin/python benchmarks/reward_setting.py [--seeds 0,1,2]     # about 5 minutes on one core
"""

from __future__ import annotations

import argparse
import statistics

import attrs

from field_table import DATASET, SETTINGS, SPEC
from results_md import write_section
from rollpacker.sim import SimConfig, Simulation

CANDIDATES = {
    "hedge after 2 s, 1 copy, no extra workers (the default)": dict(hedge_after=2.0, hedge_copies=1, burst_workers=0),
    "hedge after 1 s, 1 copy, no extra workers": dict(hedge_after=1.0, hedge_copies=1, burst_workers=0),
    "hedge after 1 s, 3 copies, no extra workers": dict(hedge_after=1.0, hedge_copies=3, burst_workers=0),
    "hedge after 2 s, 3 copies, no extra workers": dict(hedge_after=2.0, hedge_copies=3, burst_workers=0),
    "hedge after 1 s, 3 copies, 64 extra workers (the simulator's earlier default)":
        dict(hedge_after=1.0, hedge_copies=3, burst_workers=64),
    "hedge after 1 s, 1 copy, 64 extra workers": dict(hedge_after=1.0, hedge_copies=1, burst_workers=64),
    "hedge after 2 s, 1 copy, 64 extra workers": dict(hedge_after=2.0, hedge_copies=1, burst_workers=64),
}


def per_batch(policy: str, seed: int, constants) -> dict:
    model, instances, tp, prompts, max_tokens = SETTINGS["32k 64x7B"]
    config = SimConfig(workload="servegen-r1", policy=policy, prompts=prompts, samples=8, max_tokens=max_tokens,
                       seed=seed, instances=instances, tp=tp, tp_mode="plan", model=model, dataset_prompts=DATASET,
                       between=0.9, epochs=1)
    return Simulation(config, constants).run()["total"]


def row(name: str, knobs: dict, seeds: list[int]) -> str:
    constants = attrs.evolve(SPEC, reward=attrs.evolve(SPEC.reward, **knobs))
    runs = [(per_batch("tail", s, constants), per_batch("sync", s, constants)) for s in seeds]
    ratio = statistics.median(sync["step_s_per_batch"] / ours["step_s_per_batch"] for ours, sync in runs)
    ours = statistics.median(o["step_s_per_batch"] for o, _ in runs)
    wait = statistics.median(o["reward_s"] / o["steps"] for o, _ in runs)
    sync = statistics.median(s["step_s_per_batch"] for _, s in runs)
    line = f"| {name} | {ratio:.2f}x | {ours:.1f} | {wait:.2f} | {sync:.1f} |"
    print(line, flush=True)
    return line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    seeds = [int(s) for s in ap.parse_args().seeds.split(",")]
    rows = [row(name, knobs, seeds) for name, knobs in CANDIDATES.items()]
    body = (f"`.venv/bin/python benchmarks/reward_setting.py --seeds {','.join(map(str, seeds))}` (simulator; 32k, 64 x "
            "Qwen2.5-7B, servegen-r1 between 0.9, P=128 R=8, an epoch of 512 prompts; ours-best and sync on the same "
            "engine as in the field table; whole step per P trained, medians over the seeds; the reward model's "
            "execution times are the simulator's assumptions, rollpacker/sim/constants.py).\n\n"
            "| reward setting | ours-best over sync, same engine | ours-best s per P | its reward wait s a step | "
            "sync s per P |\n|---|---|---|---|---|\n" + "\n".join(rows) + "\n\nHedging's delay and copies move the "
            "ratio by about 1%; 64 extra workers (a resource a user must provide, charged to every policy alike) by "
            "about 8%. The default is the first row, the reference trainer's defaults: the simulator and the live path "
            "share it (the core's RewardConfig defaults), and the headline uses it.")
    write_section("One reward setting (issue 45, item 5)", body)


if __name__ == "__main__":
    main()
