"""Steps at a glance: exposed stage times, rollout tokens/s, the wasted-token share (with what it
means), and the mean reward when the records have one.  Reads the per-step records that both the reference trainer
(metrics.jsonl) and the simulator (its JSON's "steps") write; long rounds are marked.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

WASTED_MEANS = ("wasted: tokens generated, then discarded (never trained), the price of ending a round without "
                "waiting for its tail:\nthe partial responses of over-launched requests (aborted once their prompt "
                "had R answers) and of the tail aborted at the round's end,\nplus finished responses beyond R or of a "
                "prompt deferred to a long round")
"""Said where the wasted-token share is drawn: without it a short round's 50% reads as a fault."""

STAGES = (("rollout_s", "tab:blue", "rollout"), ("reward_s", "tab:orange", "reward"),
          ("train_exposed_s", "tab:green", "train (exposed)"), ("sync_s", "tab:purple", "weight sync"))


def stage_s(record: dict, key: str) -> float:
    """A stage's exposed seconds; a record without the training split (a simulator JSON written
    before the records were one) had only the exposed training, as `train_s`."""
    if key == "train_exposed_s":
        return record.get(key, record.get("train_s", 0.0))
    return record.get(key, 0.0)


def tokens_per_s(record: dict) -> float:
    rollout = record.get("rollout_s", 0.0)
    return record.get("tokens_per_s", record.get("generated_tokens", 0) / rollout if rollout else 0.0)


def wasted_share(record: dict) -> float:
    generated = record.get("generated_tokens", 0)
    return record.get("wasted_tokens", 0) / generated if generated else 0.0


def plot_step_summary(records: Sequence[dict], path: Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    has_reward = any("mean_reward" in r for r in records)
    rows = 4 if has_reward else 3
    fig, axes = plt.subplots(rows, 1, figsize=(9, 2.0 * rows + 0.6), sharex=True)
    steps = [r["step"] for r in records]
    width = 0.8 if len(steps) < 200 else 1.0
    bottom = [0.0] * len(records)
    for key, color, label in STAGES:  # training overlapped with the rollout is not exposed time
        values = [stage_s(r, key) for r in records]
        axes[0].bar(steps, values, bottom=bottom, color=color, label=label, width=width, lw=0)
        bottom = [a + b for a, b in zip(bottom, values)]
    longs = [(r["step"], b) for r, b in zip(records, bottom) if r.get("round") == "long"]
    if longs:
        axes[0].plot(*zip(*longs), "kv", ms=4, label="long round")
    axes[0].set_ylim(0, max(bottom + [1e-9]) * 1.3)  # room for the legend
    axes[0].set_ylabel("seconds (exposed)")
    axes[0].legend(fontsize=7, ncol=4, loc="upper right")
    axes[1].plot(steps, [tokens_per_s(r) for r in records], marker="o" if len(steps) <= 50 else None, color="tab:blue")
    axes[1].set_ylabel("rollout tokens/s")
    axes[1].set_ylim(bottom=0)
    _wasted(axes[2], records, width)
    if has_reward:
        axes[3].plot(steps, [r.get("mean_reward", 0.0) for r in records], marker="o" if len(steps) <= 50 else None)
        axes[3].set_ylabel("mean reward")
    axes[-1].set_xlabel("step")
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    if title:
        axes[0].set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return Path(path)


def _wasted(ax, records: Sequence[dict], width: float) -> None:
    """The wasted-token share per step, by round kind (short, long, normal) with each kind's mean,
    and what it means."""
    kinds = {}
    for r in records:
        kinds.setdefault(r.get("round", "normal"), []).append(r)
    for kind, picked in kinds.items():
        shares = [100 * wasted_share(r) for r in picked]
        ax.bar([r["step"] for r in picked], shares, color="tab:gray" if kind == "long" else "tab:red", width=width,
               lw=0, label=f"{kind} rounds: mean {sum(shares) / len(shares):.0f}%")
    ax.set_ylabel("wasted tokens %")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7, loc="upper right")
    ax.set_title(WASTED_MEANS, fontsize=7, loc="left")
