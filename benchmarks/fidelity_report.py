"""The plot and the RESULTS.md table of benchmarks/fidelity.py, from the committed metrics alone
(benchmarks/fidelity/SETTING/POLICY/seedK/{metrics,eval}.jsonl and setting.json).

Time is training time: the sum of the steps' `step_s` up to a point (the held-out evaluations run
between steps and are not in it), so a run spread over several sessions has one time axis."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from attrs import frozen

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_md import write_section  # noqa: E402

LAST = 10
"""The final held-out reward is the mean of the last LAST evaluations (and trained reward of the last LAST steps)."""
STYLES = {"sync": "tab:blue", "tail": "tab:orange", "tail-unbiased": "tab:green"}
DASHES = ("-", "--", ":", "-.")
SMOOTH = 5
"""Per-step curves are plotted as means over this many steps (a step trains only P groups)."""
TITLE = "Fidelity: reward curves of sync, tail and unbiased tail"


@frozen
class Curve:
    policy: str
    seed: int
    steps: list[dict]
    evals: list[dict]

    @property
    def label(self) -> str:
        return f"{self.policy} seed {self.seed}"

    def train_time(self, upto: int | None = None) -> float:
        """Seconds of training in the first `upto` steps (None: all)."""
        return sum(r["step_s"] for r in self.steps if upto is None or r["step"] < upto)

    def cumulative_time(self) -> list[float]:
        out, total = [], 0.0
        for r in self.steps:
            total += r["step_s"]
            out.append(total)
        return out


def load_curves(metrics: Path, runs) -> list[Curve]:
    from rollpacker.train.outputs import read_jsonl

    curves = []
    for run in runs:
        folder = metrics / run.policy / f"seed{run.seed}"
        steps = read_jsonl(folder / "metrics.jsonl")
        if steps:
            curves.append(Curve(run.policy, run.seed, steps, read_jsonl(folder / "eval.jsonl")))
    return curves


def at_common_steps(curves: list[Curve]) -> list[Curve]:
    """Each curve cut to the steps that every curve reached, with its evaluations up to there: policies
    and seeds are compared at equal training, not at wherever each partial run stopped (a seed's finals
    and gains at another number of steps would widen the seed spread the policies are compared against)."""
    common = min((len(c.steps) for c in curves), default=0)
    return [Curve(c.policy, c.seed, c.steps[:common], [e for e in c.evals if e["step"] <= common]) for c in curves]


def _mean(values) -> float | None:
    values = list(values)
    return statistics.fmean(values) if values else None


def run_row(c: Curve, level: float | None, key: str = "eval_reward") -> dict:
    evals = c.evals
    trained = [e for e in evals if e["step"] > 0]  # the final figure is of trained weights only
    first, last = c.steps[:LAST], c.steps[-LAST:]
    reached = next((e for e in evals if level is not None and e.get(key, -1.0) >= level), None)
    return {"policy": c.policy, "seed": c.seed, "steps": len(c.steps), "evals": len(evals),
            "eval_start": evals[0]["eval_reward"] if evals and evals[0]["step"] == 0 else None,
            "eval_final": _mean(e["eval_reward"] for e in trained[-LAST:]), "final_evals": len(trained[-LAST:]),
            "train_reward_first": _mean(r["mean_reward"] for r in first),
            "train_reward_last": _mean(r["mean_reward"] for r in last),
            "kept_first": _mean(r["mean_kept_length"] for r in first), "kept_last": _mean(r["mean_kept_length"] for r in last),
            "launched_first": _mean(r["mean_generated_length"] for r in first),
            "launched_last": _mean(r["mean_generated_length"] for r in last),
            "eval_length_first": evals[0]["eval_length"] if evals else None,
            "eval_length_last": _mean(e["eval_length"] for e in trained[-LAST:]),
            "train_s": c.train_time(), "step_s": c.train_time() / len(c.steps),
            "time_to_level": None if reached is None else c.train_time(reached["step"]),
            "step_to_level": None if reached is None else reached["step"],
            "eval_prompts": evals[-1]["eval_prompts"] if evals else None,
            "sampled_start": evals[0].get("eval_sampled_reward") if evals and evals[0]["step"] == 0 else None,
            "sampled_final": _mean(e["eval_sampled_reward"] for e in trained[-LAST:] if "eval_sampled_reward" in e),
            "eval_samples": evals[-1].get("eval_samples") if evals else None,
            "eval_set": evals[-1].get("eval_set") if evals else None}


def level_key(curves: list[Curve]) -> str:
    """What the time to a reward level reads: the sampled held-out reward where every run has it (the
    reward of the policy as trained), the greedy one otherwise."""
    sampled = all(any("eval_sampled_reward" in e for e in c.evals) for c in curves)
    return "eval_sampled_reward" if curves and sampled else "eval_reward"


def reward_level(curves: list[Curve], key: str = "eval_reward") -> float | None:
    """Halfway from the mean held-out reward (`key`) before training to the lowest policy's mean final
    one (None unless every policy ends above the start)."""
    starts = [c.evals[0][key] for c in curves if c.evals and c.evals[0]["step"] == 0 and key in c.evals[0]]
    finals: dict[str, list[float]] = {}
    for c in curves:
        trained = [e[key] for e in c.evals if e["step"] > 0 and key in e]
        if trained:
            finals.setdefault(c.policy, []).append(statistics.fmean(trained[-LAST:]))
    if not starts or not finals:
        return None
    low, start = min(statistics.fmean(v) for v in finals.values()), statistics.fmean(starts)
    return round(start + (low - start) / 2, 3) if low > start else None  # None: some policy did not rise


def policy_rows(rows: list[dict]) -> dict[str, dict]:
    """Per policy: the mean of its seeds' final held-out rewards (greedy `final`, sampled `sampled`), the
    range of those finals between seeds (`final_range`), and the seed spread the policies are compared
    against (`spread`, `sampled_spread`): the range of the seeds' gains, final minus before training.
    Each seed has a held-out set of its own (the pool less that seed's training rows), so seeds start at
    different levels and the finals' range holds that offset too; the gains do not (the range of the
    finals stands in where a run has no evaluation before training)."""
    out: dict[str, dict] = {}
    for policy in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == policy]
        for name, final, start in (("final", "eval_final", "eval_start"), ("sampled", "sampled_final", "sampled_start")):
            finals = [r[final] for r in mine if r[final] is not None]
            if not finals or (name == "sampled" and policy not in out):
                continue
            gains = [r[final] - r[start] for r in mine if r[final] is not None and r[start] is not None]
            spread = max(gains) - min(gains) if len(gains) == len(finals) else max(finals) - min(finals)
            out.setdefault(policy, {"step_s": statistics.fmean(r["step_s"] for r in mine)})
            out[policy].update({name: statistics.fmean(finals), f"{name}_range": max(finals) - min(finals),
                                "spread" if name == "final" else "sampled_spread": spread,
                                "seeds" if name == "final" else "sampled_seeds": len(finals)})
    return out


def reading(per_policy: dict[str, dict], rows: list[dict]) -> list[str]:
    """The comparisons, as numbers: each policy against sync, seed by seed (paired: the same held-out
    set, data order and start) and on average, beyond or within the seeds' spread of gains."""
    lines = []
    sync = per_policy.get("sync")
    eval_n = next((r["eval_prompts"] for r in rows if r["eval_prompts"]), None)
    if eval_n:
        lines.append(f"One evaluation scores {eval_n} prompts once each (greedy): its standard error is at most "
                     f"{0.5 / eval_n ** 0.5:.3f}; the final figure averages {LAST} (correlated) evaluations.")
    for r in rows:
        if r["policy"] == "sync" and r["eval_start"] is not None and r["eval_final"] is not None:
            sampled = (f"; sampled, {r['sampled_start']:.3f} and {r['sampled_final']:.3f} "
                       f"({r['sampled_final'] - r['sampled_start']:+.3f})"
                       if r["sampled_start"] is not None and r["sampled_final"] is not None else "")
            lines.append(f"sync seed {r['seed']}: held-out reward {r['eval_start']:.3f} before training, "
                         f"{r['eval_final']:.3f} at the end ({r['eval_final'] - r['eval_start']:+.3f}){sampled}.")
    if len({r["seed"] for r in rows}) > 1 and any(r.get("eval_set") is None for r in rows):
        lines.append("Each seed is scored on a held-out set of its own (the pool less the problems that seed trains), "
                     "so seeds start at different levels: a policy is compared with sync seed by seed, and the seed "
                     "spread is the range of the gains (final - before training) between seeds.")
    lines.append("Step times come from whatever else the machine ran meanwhile: runs made at different loads (a shared "
                 "CPU) compare only roughly; the tokens kept and wasted per step are in the metrics.")
    if sync is None:
        return lines
    for policy, p in per_policy.items():
        if policy == "sync":
            continue
        line = (f"{policy} - sync, final held-out reward: "
                f"{_against(p, sync, 'final', 'spread', 'seeds', paired(rows, policy, 'eval_final'))}")
        if "sampled" in p and "sampled" in sync:
            line += (f"; sampled: "
                     f"{_against(p, sync, 'sampled', 'sampled_spread', 'sampled_seeds', paired(rows, policy, 'sampled_final'))}")
        lines.append(f"{line}; mean step {p['step_s']:.1f} s vs sync's {sync['step_s']:.1f} s "
                     f"({sync['step_s'] / p['step_s']:.2f}x sync's speed).")
    return lines


def paired(rows: list[dict], policy: str, final: str) -> list[tuple[int, float]]:
    """(seed, `policy`'s `final` minus sync's) for every seed where both have it."""
    sync = {r["seed"]: r[final] for r in rows if r["policy"] == "sync" and r[final] is not None}
    return [(r["seed"], r[final] - sync[r["seed"]]) for r in rows
            if r["policy"] == policy and r[final] is not None and r["seed"] in sync]


def _against(p: dict, sync: dict, key: str, spread_key: str, seeds_key: str, per_seed: list[tuple[int, float]]) -> str:
    """`p`'s figure minus sync's (mean over seeds, then seed by seed), and whether that is beyond the
    larger of their seed spreads."""
    diff, spread = p[key] - sync[key], max(p[spread_key], sync[spread_key])
    if min(p[seeds_key], sync[seeds_key]) < 2:
        return f"{diff:+.3f} (one seed: no seed range to compare it with)"
    signs = {d > 0 for _, d in per_seed}
    seeds = ", ".join(f"seed {seed} {d:+.3f}" for seed, d in per_seed)
    return (f"{diff:+.3f} ({seeds}: {'the same sign in every seed' if len(signs) == 1 else 'the seeds disagree'}; "
            f"{'beyond' if abs(diff) > spread else 'within'} the larger seed spread, {spread:.3f}; "
            f"{len(per_seed)} seed(s): a description, not a test)")


def _f(value, fmt: str = ".3f") -> str:
    return "-" if value is None else format(value, fmt)


def table_lines(rows: list[dict], target: int, level: float | None, key: str = "eval_reward") -> list[str]:
    samples = next((r["eval_samples"] for r in rows if r.get("eval_samples")), None)
    sampled = lambda r: (f" {_f(r['sampled_start'])} -> {_f(r['sampled_final'])} |" if samples else "")  # noqa: E731
    lines = ["Every figure of a row is over the steps that every run reached (the plot shows whole runs).",
             "",
             f"| policy | seed | steps | held-out reward: before -> final (mean of the last {LAST} evals after a step) "
             f"|{f' held-out reward, sampled ({samples} a prompt): before -> final |' if samples else ''} trained reward, first {LAST} -> last {LAST} steps (they overlap below {2 * LAST} steps) | kept length, first -> last {LAST} steps | launched length | held-out "
             f"length | mean step s | training s | s (step) to held-out reward{', sampled,' if key != 'eval_reward' else ''} "
             f"{_f(level)} |",
             "|---" * (12 if samples else 11) + "|"]
    for r in rows:
        notes = ([] if r["steps"] >= target else [f"partial, of {target}"]) + (
            [f"compared over its first {r['compared_steps']}"] if r["compared_steps"] < r["steps"] else [])
        partial = f" ({'; '.join(notes)})" if notes else ""
        reach = "not reached" if r["time_to_level"] is None else f"{r['time_to_level']:.0f} ({r['step_to_level']})"
        lines.append(
            f"| {r['policy']} | {r['seed']} | {r['steps']}{partial} | {_f(r['eval_start'])} -> {_f(r['eval_final'])} "
            f"({r['final_evals']} evals) |{sampled(r)} {_f(r['train_reward_first'])} -> {_f(r['train_reward_last'])} | "
            f"{_f(r['kept_first'], '.1f')} -> {_f(r['kept_last'], '.1f')} | {_f(r['launched_first'], '.1f')} -> "
            f"{_f(r['launched_last'], '.1f')} | {_f(r['eval_length_first'], '.1f')} -> {_f(r['eval_length_last'], '.1f')} | "
            f"{r['step_s']:.1f} | {r['train_s']:.0f} | {reach} |")
    return lines


def rolling_mean(values: list[float], width: int) -> list[float]:
    """Each value's mean with up to `width` - 1 values before it."""
    return [statistics.fmean(values[max(0, i - width + 1): i + 1]) for i in range(len(values))]


def plot(curves: list[Curve], path: Path) -> None:
    """Held-out reward, trained reward, kept and launched length against step (left) and training
    time (right): one colour per policy, one dash per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("held-out reward (greedy)", "eval_reward")]
    if any("eval_sampled_reward" in e for c in curves for e in c.evals):
        panels.append(("held-out reward (sampled\nas trained)", "eval_sampled_reward"))
    panels += [(f"trained samples' reward\n({SMOOTH}-step mean)", "mean_reward"),
              (f"kept (trained) length\n({SMOOTH}-step mean)", "mean_kept_length"),
              (f"launched length, aborted at\ntheir cut ({SMOOTH}-step mean)", "mean_generated_length")]
    fig, axes = plt.subplots(len(panels), 2, figsize=(12, 3.2 * len(panels)), sharex="col")
    seeds = sorted({c.seed for c in curves})
    for c in curves:
        style = dict(color=STYLES.get(c.policy), linestyle=DASHES[seeds.index(c.seed) % len(DASHES)], label=c.label)
        times = [0.0, *c.cumulative_time()]
        for row, (_, key) in enumerate(panels):
            if key.startswith("eval"):
                evals = [e for e in c.evals if key in e]
                xs, ys = [e["step"] for e in evals], [e[key] for e in evals]
                ts = [times[min(s, len(times) - 1)] for s in xs]
                style_here = dict(style, marker=".")
            else:
                xs, ys = [r["step"] + 1 for r in c.steps], rolling_mean([r[key] for r in c.steps], SMOOTH)
                ts, style_here = times[1:], dict(style, alpha=0.8, linewidth=1)
            axes[row][0].plot(xs, ys, **style_here)
            axes[row][1].plot([t / 60 for t in ts], ys, **style_here)
    for row, (title, _) in enumerate(panels):
        axes[row][0].set_ylabel(title)
    axes[-1][0].set_xlabel("optimizer steps")
    axes[-1][1].set_xlabel("training minutes (sum of step times; evaluations excluded)")
    axes[0][1].legend(fontsize=8, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def report(metrics: Path, plot_path: Path, results: Path | None, runs, target: int) -> dict:
    """Plot the runs' committed curves, write the RESULTS.md section (unless `results` is None), and
    return the rows, the per-policy figures and the section's text."""
    curves = load_curves(metrics, runs)
    setting = json.loads((metrics / "setting.json").read_text()) if (metrics / "setting.json").exists() else {}
    if not curves:
        text = f"no metrics yet in {metrics}"
        if setting.get("design") == "tost" and results is not None:  # the design is stated before any run
            from fidelity_equivalence import section_lines

            text = "\n".join([f"Setting `{setting['setting']}`: {setting.get('what', '')}; {target} steps per run. Flags: "
                              f"`{' '.join(setting.get('flags', []))}` plus the policy's and `--seed`.", "",
                              *section_lines([], setting, target, None), "",
                              *([setting["why"], ""] if setting.get("why") else []), "No run has finished a step yet."])
            write_section(f"{TITLE} ({setting['setting']})", text, path=results)
        return {"rows": [], "policies": {}, "text": text}
    compared = at_common_steps(curves)
    key = level_key(compared)
    level = reward_level(compared, key)
    rows = [{**run_row(cut, level, key), "steps": len(c.steps), "compared_steps": len(cut.steps)}
            for c, cut in zip(curves, compared)]
    per_policy = policy_rows(rows)
    plot(curves, plot_path)
    devices = sorted({r.get("device", "?") for c in curves for r in c.steps})
    done = all(r["steps"] >= target for r in rows) and len(rows) == len(list(runs))
    lines = [f"Setting `{setting.get('setting', metrics.name)}`: {setting.get('what', '')}; {target} steps per run; "
             f"device {', '.join(devices)}. Flags: `{' '.join(setting.get('flags', []))}` plus the policy's and "
             f"`--seed`. Made by `python benchmarks/fidelity.py` from the metrics in "
             f"`{_relative(metrics)}` (plot: `{_relative(plot_path)}`)."
             + ("" if done else " **Partial**: the runs below marked partial are still training (or were cut); "
                                "runs not listed have not started."),
             *(["", setting["why"]] if setting.get("why") else []), "",
             *table_lines(rows, target, level, key), "",
             "Final held-out reward per policy (mean over seeds, and the range between seeds): "
             + "; ".join(f"{p} {v['final']:.3f} (range {v['final_range']:.3f}, {v['seeds']} seed(s))"
                         for p, v in per_policy.items()) + ".", "",
             *(f"- {line}" for line in reading(per_policy, rows))]
    if setting.get("design") == "tost":
        from fidelity_equivalence import section_lines

        test_plot = plot_path.with_name(plot_path.stem + "-equivalence.png")
        test_plot.unlink(missing_ok=True)  # drawn again below once a pair is complete
        design = section_lines(curves, setting, target, test_plot)
        lines[1:1] = ["", *design, *([f"(plot: `{_relative(test_plot)}`)"] if test_plot.exists() else [])]
    text = "\n".join(lines)
    if results is not None:
        write_section(f"{TITLE} ({setting.get('setting', metrics.name)})", text, path=results)
    return {"rows": rows, "policies": per_policy, "level": level, "complete": done, "text": text}


def _relative(path: Path) -> str:
    root = Path(__file__).resolve().parents[1]
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return str(path)
