"""The tables of benchmarks/sim_vs_real.py: per round and per policy, measured beside predicted, from a
run's result (its `result.json`)."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from rollpacker.sim.engine_profile import EngineProfile


def profile_line(p: EngineProfile) -> str:
    decode = (f"decode steps timed alone {', '.join(f'{s * 1e3:.0f} ms at {b}' for b, s in p.decode_rows)} rows "
              f"(at {p.decode_context} tokens a row) + the loop's {p.loop_s * 1e3:.2f} ms + {p.t1 * 1e3:.3f} ms/row, "
              f"t0 {p.t0 * 1e3:.2f} ms a prefill" if p.decode_rows else
              f"t0 {p.t0 * 1e3:.2f} ms, t1 {p.t1 * 1e3:.3f} ms/row")
    return (f"{decode}, t2 {p.t2 * 1e6:.3f} us/context token, "
            f"prefill {p.prefill_t1 * 1e6:.1f} us/token + t0 "
            + ("(a prompt once for its samples admitted together)" if p.shared_prefill else "(each request its own)")
            + f", run overhead {p.run_overhead_s * 1e3:.1f} ms, abort {p.abort_s * 1e3:.1f} ms + {p.abort_request_s * 1e3:.1f} ms a request caught"
            + (" (on the fit runs' live rounds)" if "live_aborts" in p.fit else "") + ", "
            + f"live path {p.launch_s * 1e3:.1f} ms a launch + {p.return_s * 1e3:.0f} ms an answer's way back"
            + (" (measured by the servers)" if "ways_back" in p.fit else "") + " + "
            f"{p.submit_s * 1e3:.1f} ms a launched request + {p.step_s * 1e3:.2f} ms a decode step + "
            f"{p.event_s * 1e3:.2f} ms a finished request; "
            f"fit median error {p.fit.get('median_abs_error', 0):.1%}, max {p.fit.get('max_abs_error', 0):.1%}")


def origin(profile: dict) -> str:
    """Where a profile's decode and prefill costs came from."""
    if profile.get("decode_rows"):
        return "timed alone forward by forward, the engine loop's own work fitted on the calibration grid"
    return "fitted on the calibration grid"


# -- comparison -------------------------------------------------------------------------------------------

def longest(record: dict) -> int:
    return record["longest_request"] if "longest_request" in record else max((q[1] for q in record["requests"]), default=0)


def round_rows(real: list[dict], sim: list[dict]) -> list[dict]:
    """Per round (step 0 left out): measured and predicted rollout, trainer stage (its micro-batches, optimizer
    step and weight sync), longest request, bubble, wasted tokens."""
    return [{"step": r["step"], "round": r["round"], "sim_round": s["round"], "rollout": (r["rollout_s"], s["rollout_s"]),
             "step_s": (r["step_s"], s["step_s"]), "train": (r["train_s"] + r["sync_s"], s["train_s"] + s["sync_s"]),
             "longest": (longest(r), longest(s)),
             "bubble": (r["bubble_ratio"], s["bubble_ratio"]), "wasted": (r["wasted_tokens"], s["wasted_tokens"])}
            for r, s in zip(real[1:], sim[1:])]


def error(measured: float, predicted: float) -> float:
    return predicted / measured - 1 if measured else 0.0


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def summarize(runs: dict) -> dict:
    """Per (policy, seed): mean measured/predicted step and rollout, median per-round error; ratios to sync."""
    out = {}
    for (policy, seed), rows in runs.items():
        out[policy, seed] = {
            "step": (mean(r["step_s"][0] for r in rows), mean(r["step_s"][1] for r in rows)),
            "rollout": (mean(r["rollout"][0] for r in rows), mean(r["rollout"][1] for r in rows)),
            "round_error": statistics.median(abs(error(*r["rollout"])) for r in rows),
            **({"train": (mean(r["train"][0] for r in rows), mean(r["train"][1] for r in rows))}
               if all("train" in r for r in rows) else {}),  # (a result measured before it was kept: none)
            "kinds_agree": sum(r["round"] == r["sim_round"] for r in rows) / len(rows)}
    for (policy, seed), s in out.items():
        base = out.get(("sync", seed))
        if base is not None:
            s["ratio"] = tuple(base["step"][i] / s["step"][i] for i in (0, 1))
            s["rollout_ratio"] = tuple(base["rollout"][i] / s["rollout"][i] for i in (0, 1))
    return out


# -- the report -------------------------------------------------------------------------------------------

def pair_text(pair: tuple[float, float] | None) -> str:
    return "-" if pair is None else f"{pair[0]:.2f} / {pair[1]:.2f} ({error(*pair):+.1%})"


def streams_training(args) -> bool:
    """Whether the measured run trains beside the rollout (--train-beside; else after the round: `run_flags`).
    A result measured before the flag: SGLang's trained beside."""
    return getattr(args, "train_beside", args.engine == "sglang")


def training(args) -> str:
    if streams_training(args):
        return "streamed beside the rollout, on the same cores"
    return "after the round (`--train-after-round`: the servers keep their memory)" if args.engine == "sglang" else "colocated"


def report(result: dict) -> str:
    a = argparse.Namespace(**result["args"])
    runs = {(p, int(s)): rows for p, s, rows in result["runs"]}
    summary = summarize(runs)
    lines = [f"`benchmarks/sim_vs_real.py {result['command']}`; engine: {result['profile']['engine']}, model "
             f"{a.model}; machine {result['machine']}; {result['date']}.  Check workload {a.workload} ({a.scale_from} "
             f"trace tokens -> {a.max_tokens}); fit workload {a.fit_workload} ({a.fit_scale_from} -> {a.max_tokens}); "
             f"P={a.prompts} R={a.samples}, engine capacity {a.capacity}, {a.steps} steps a run (step 0 a warm-up, left "
             f"out), training {training(a)}." + (" The profile and every prediction were made again from these "
             "measurements (`--report DIR --refit`) after the latency model's terms were fixed." if result.get("refit")
             else ""), "",
             f"Profile (decode and prefill {origin(result['profile'])}, the live path's terms on the fit workload's "
             f"{' and '.join((getattr(a, 'fit_policy', None) or 'sync').split(','))} "
             f"run{'s' * (',' in (getattr(a, 'fit_policy', None) or ''))}): "
             f"{profile_line(EngineProfile(**result['profile']))}.",
             "Other stages (the trainer calibrated on its own grid; the scorer's latency and the weight sync from the "
             "fit run): " + ", ".join(f"{k} {v:.4g}" for k, v in result["stages"].items()) + ".", "",
             "| policy | seed | mean step s measured / predicted (error) | mean rollout s measured / predicted (error) | "
             "per-round rollout median abs error | mean trainer stage s measured / predicted (error) | round kinds agree | "
             "sync/policy step measured / predicted (error) |",
             "|---|---|---|---|---|---|---|---|"]
    for (policy, seed), s in summary.items():
        ratio = s.get("ratio")
        ratio_text = f"{ratio[0]:.2f} / {ratio[1]:.2f} ({error(*ratio):+.1%})" if ratio and policy != "sync" else "-"
        lines.append(f"| {policy} | {seed} | {s['step'][0]:.2f} / {s['step'][1]:.2f} ({error(*s['step']):+.1%}) | "
                     f"{s['rollout'][0]:.2f} / {s['rollout'][1]:.2f} ({error(*s['rollout']):+.1%}) | "
                     f"{s['round_error']:.1%} | {pair_text(s.get('train'))} | {s['kinds_agree']:.0%} | {ratio_text} |")
    lines += ["", "Per round (measured / predicted):", "",
              "| policy | seed | step | round (real, sim) | rollout s | longest request | bubble | wasted tokens |",
              "|---|---|---|---|---|---|---|---|"]
    for (policy, seed), rows in runs.items():
        for r in rows:
            lines.append(f"| {policy} | {seed} | {r['step']} | {r['round']}, {r['sim_round']} | "
                         f"{r['rollout'][0]:.2f} / {r['rollout'][1]:.2f} | {r['longest'][0]} / {r['longest'][1]} | "
                         f"{r['bubble'][0]:.2f} / {r['bubble'][1]:.2f} | {r['wasted'][0]} / {r['wasted'][1]} |")
    return "\n".join(lines) + "\n"


def headline(result: dict, policy: str = "tail") -> str:
    runs = {(p, int(s)): rows for p, s, rows in result["runs"]}
    ratios = [s["ratio"] for (p, _), s in summarize(runs).items() if p == policy and "ratio" in s]
    measured = statistics.median(r[0] for r in ratios)
    predicted = statistics.median(r[1] for r in ratios)
    return f"sim vs real: sync/{policy} measured {measured:.2f} predicted {predicted:.2f} (error {error(measured, predicted):+.1%})"




MEASURED = Path(__file__).resolve().parent / "sim_vs_real"
"""The committed measurements of benchmarks/sim_vs_real.py, one JSON result per engine and model."""


def rests_on(reward) -> str:
    """The headline's line of what it rests on: its latency model, its reward setting (`reward`, the simulator's
    RewardConstants), and how well profiles fitted to the engines we ran predicted them (from the committed
    measurements)."""
    ratios, rounds = [], []
    for path in sorted(MEASURED.glob("*.json")):
        result = json.loads(path.read_text())
        summary = summarize({(p, int(s)): rows for p, s, rows in result["runs"]})
        rounds += [s["round_error"] for s in summary.values()]
        ratios += [abs(error(*s["ratio"])) for (p, _), s in summary.items() if p == "tail" and "ratio" in s]
    copies = f"{reward.hedge_copies} cop{'y' if reward.hedge_copies == 1 else 'ies'}"
    return ("  What it rests on: the H100 latency model of rollpacker/sim/constants.py (published measurements, not "
            "fitted to a GPU we ran: no GPU engine profile yet); the reward setting the reference trainer uses too, "
            f"hedge after {reward.hedge_after:g} s, {copies}, {reward.burst_workers} extra workers (section \"One reward "
            f"setting\").  How far to trust the latency model: on the engines we ran ({len(list(MEASURED.glob('*.json')))}"
            f" CPU settings), a profile fitted to each predicted the sync/tail step ratio of a seed within "
            f"{min(ratios):.1%}-{max(ratios):.1%} and a run's rounds within {min(rounds):.1%}-{max(rounds):.1%} (median "
            "error; section \"Simulator against real engines\").")
