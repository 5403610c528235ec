"""`--plot`: a step's per-instance timeline (decode, prefill, idle gaps, aborts) and step times."""

from __future__ import annotations

from pathlib import Path


def plot_run(result: dict, timelines: dict, step: int, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(2, 1, figsize=(12, 8), gridspec_kw={"height_ratios": [3, 1]})
    tl = timelines[step]
    t0 = tl["start"]
    colors = {"decode": "tab:blue", "prefill": "tab:orange"}
    for index, intervals in tl["intervals"].items():
        for kind in colors:
            bars = [(s - t0, e - s) for s, e, _, k in intervals if k == kind]
            if bars:
                ax.broken_barh(bars, (index - 0.4, 0.8), facecolors=colors[kind])
    aborts = tl["aborts"]
    if aborts:
        ax.scatter([a[1] - t0 for a in aborts], [a[0] for a in aborts], marker="|", color="tab:red", s=30,
                   label=f"aborted request ({sum(a[2] for a in aborts)} tokens)")
    rec = result["steps"][step]
    ax.set(xlabel="seconds since round start", ylabel="instance",
           title=f"step {step} ({rec['round']} round): rollout {rec['rollout_s']:.1f} s, "
                 f"lower bound {rec['lower_bound_rollout_s']:.1f} s, bubble {rec['bubble_ratio']:.1%}; "
                 f"blue decode, orange prefill, white idle")
    if aborts:
        ax.legend(loc="upper right")
    steps = result["steps"]
    xs = range(len(steps))
    bottom = [0.0] * len(steps)
    for key, color in (("rollout_s", "tab:blue"), ("reward_s", "tab:green"), ("train_s", "tab:purple")):
        vals = [s[key] for s in steps]
        bx.bar(xs, vals, bottom=bottom, color=color, label=key)
        bottom = [b + v for b, v in zip(bottom, vals)]
    bx.plot(xs, [s["lower_bound_rollout_s"] for s in steps], "k_", markersize=20, label="rollout lower bound")
    bx.set(xlabel="step", ylabel="seconds", title=f"{result['config']['policy']}: step times")
    bx.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
