"""Writing a simulated run's per-sample lengths as a veRL rollout dump (tests/test_advise_roundtrip.py,
benchmarks/advise_example.py): text of exactly the right number of tokens for the default tokenizer ("a"
then " a" repeated: one token each), the EOS stripped as veRL strips it."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from rollpacker.sim import SimConfig, Simulation
from rollpacker.sim.workloads import Workload, load_workload


class Recording(Workload):
    """A workload that keeps every draw: (step, prompt index) -> lengths."""

    def __init__(self, inner: Workload) -> None:
        self.inner, self.name, self.num_prompts = inner, inner.name, inner.num_prompts
        self.prompts = inner.prompts
        self.draws: dict[tuple[int, int], list[int]] = {}

    def sample(self, prompt_index: int, step: int) -> int:
        n = self.inner.sample(prompt_index, step)
        self.draws.setdefault((step, prompt_index), []).append(n)
        return n

    def mean_length(self) -> float:
        return self.inner.mean_length()


def text_of(tokens: int) -> str:
    return "a" + " a" * (tokens - 1) if tokens > 0 else ""


def sync_lengths(config: SimConfig) -> tuple[Recording, dict]:
    """Run sync on `config` and keep the lengths it drew."""
    dataset = config.dataset_prompts
    workload = Recording(load_workload(config.workload, num_prompts=dataset, seed=config.seed,
                                       max_tokens=config.max_tokens, between=config.between))
    Simulation(config, workload=workload).run()
    return workload, workload.draws


def write_verl_dump(workload: Recording, cap: int, folder: Path) -> Path:
    """One <step>.jsonl per step: a line per sample, `uid` = <prompt-uid>_0_<index>, `input` as many tokens as
    the prompt's, `output` the response's tokens less the EOS (none at the cap)."""
    folder.mkdir(parents=True, exist_ok=True)
    by_step: dict[int, list[str]] = {}
    for (step, prompt), lengths in sorted(workload.draws.items()):
        uid = uuid.UUID(int=prompt)
        for index, n in enumerate(lengths):
            output = text_of(n if n >= cap else n - 1)
            by_step.setdefault(step, []).append(json.dumps({
                "input": text_of(workload.prompt_tokens(prompt)), "output": output, "gts": "", "score": 0.0,
                "step": step, "uid": f"{uid}_0_{index}"}))
    for step, lines in by_step.items():
        (folder / f"{step}.jsonl").write_text("\n".join(lines) + "\n")
    return folder
