"""What the reference trainer prints while it works: a line per setup phase, progress bars per
stage of a step (tqdm), and the one-line step summary."""

from __future__ import annotations

import time
from collections.abc import Callable

from tqdm import tqdm


class Phases:
    """A line per setup phase on stdout, as it starts, with the seconds since the run began.

    Before its first step a run converts the default model (once), loads it, builds the trainer,
    the engine and the reward workers and saves its first state: minutes on a CPU, which a run that
    prints nothing meanwhile spends looking hung (and the step bars are off when stderr is not a
    terminal)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.start = clock()

    def __call__(self, what: str) -> None:
        print(f"[{self.clock() - self.start:6.1f} s] {what}", flush=True)


class StageBars:
    """One bar per stage of the current step: rollout (kept samples of P x R), reward (scored
    samples), train (micro-batches)."""

    def __init__(self, total_samples: int, disable: bool = False) -> None:
        self.total = total_samples
        self.disable = disable
        self.bars: dict[str, tqdm] = {}

    def begin_step(self, step: int) -> None:
        self.close()
        self.step = step

    def update(self, stage: str, info: dict) -> None:
        bar = self.bars.get(stage)
        if bar is None:
            total = None if stage == "train" else self.total
            bar = self.bars[stage] = tqdm(total=total, desc=f"step {self.step} {stage:7s}", leave=False,
                                          disable=self.disable, unit="sample" if stage != "train" else "mb")
        if stage == "rollout":
            bar.n = min(info.get("kept", 0), self.total)
            bar.set_postfix(running=info.get("running", 0), refresh=False)
        elif stage == "reward":
            bar.n = min(info.get("rewards", 0), self.total)
        else:
            bar.n = info.get("micro_batch", 0) + 1
        bar.refresh()

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()
        self.bars = {}


def step_line(r: dict) -> str:
    failed = r.get("reward_failures", 0)
    return (
        f"step {r['step']:3d} {r['round']:6s} | rollout {r['rollout_s']:6.1f}s reward {r['reward_s']:5.1f}s "
        f"train {r['train_s']:6.1f}s (overlapped {r['train_overlapped_s']:5.1f}s, exposed {r['train_exposed_s']:5.1f}s) | "
        f"bubble {r['bubble_ratio']:.2f} | reward {r['mean_reward']:.3f}{f' ({failed} failed)' if failed else ''} | "
        f"kept {r['kept_tokens']} / wasted {r['wasted_tokens']} tokens"
    )


def epoch_line(policy: str, prompts: int, steps: int, num_rows: int) -> str | None:
    """A note, at the start, when a step can train a row twice: once from each of two epochs.

    Each epoch visits the rows in a new order, so a step whose prompts span an epoch's end (its last
    rows, then the next epoch's first) can hold one row from both.  That happens once the run goes
    past one epoch and a step's draws need not end on an epoch's last row: sync draws P prompts a
    step, so when the rows are not a multiple of P; the other policies draw ahead of training and
    defer, so whatever the count (measured with the core on its test harness)."""
    if steps * prompts <= num_rows or (policy == "sync" and num_rows % prompts == 0):
        return None
    why = f"{num_rows} rows are not a multiple of P={prompts}" if policy == "sync" else \
        f"policy {policy} draws prompts ahead of training and defers some, whatever the number of rows"
    return (f"note: {steps} steps of P={prompts} prompts go past one epoch of {num_rows} rows, so a step whose "
            f"prompts span two epochs can train a row twice, once from each ({why})")
