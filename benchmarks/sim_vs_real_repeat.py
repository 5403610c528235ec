"""The engine against itself: two measurements of benchmarks/sim_vs_real.py with the same sizes, side by side.

A replay's requests are set by the seed (the prompts, and each response's length from the trace), so two
measurements of one (policy, seed) ran the same requests. How far their rounds and their sync ratios differ
is the engine's own repeatability on that machine: the floor under the simulator's error, which can come no
closer to one measurement than the next measurement does.

    python benchmarks/sim_vs_real_repeat.py benchmarks/sim_vs_real/sglang-tiny.json \
        benchmarks/sim_vs_real/sglang-tiny-tailfit.json [--write-results]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_md import write_section  # noqa: E402
from sim_vs_real_report import error, summarize  # noqa: E402

SAME = ("engine", "model", "workload", "scale_from", "prompts", "samples", "max_tokens", "capacity", "device",
        "dtype")
"""The sizes two measurements must share for their runs to be the same requests."""


def check_same(a: dict, b: dict) -> None:
    """Two results measured the same requests; else an error naming the field that differs."""
    for field in SAME:
        ours, theirs = a["args"].get(field), b["args"].get(field)
        if ours != theirs:
            raise ValueError(f"the two measurements differ in {field} ({ours!r} against {theirs!r}): their runs "
                             "are not the same requests")


def shared_runs(a: dict, b: dict) -> dict:
    """(policy, seed) -> (a's rows, b's rows) over the steps both measured, for the runs both measured."""
    rows_b = {(p, int(s)): rows for p, s, rows in b["runs"]}
    out = {}
    for policy, seed, rows in a["runs"]:
        theirs = rows_b.get((policy, int(seed)))
        if theirs is None:
            continue
        steps = {r["step"] for r in rows} & {r["step"] for r in theirs}
        out[policy, int(seed)] = ([r for r in rows if r["step"] in steps], [r for r in theirs if r["step"] in steps])
    return out


def repeatability(a: dict, b: dict) -> dict:
    """Per (policy, seed) both measured: the rounds compared, the median |b / a - 1| of a round's measured
    rollout, the simulator's median per-round error in each, and the measured and predicted sync/policy step
    ratios of each (over the shared steps)."""
    check_same(a, b)
    pairs = shared_runs(a, b)
    if not pairs:
        raise ValueError("the two measurements share no (policy, seed) run")
    sums = [summarize({k: rows[i] for k, rows in pairs.items()}) for i in (0, 1)]
    out = {}
    for key, (ra, rb) in pairs.items():
        out[key] = {"rounds": len(ra),
                    "engine": statistics.median(abs(error(x["rollout"][0], y["rollout"][0])) for x, y in zip(ra, rb)),
                    "simulator": (sums[0][key]["round_error"], sums[1][key]["round_error"]),
                    "ratio": (sums[0][key].get("ratio"), sums[1][key].get("ratio"))}
    return out


def span(values) -> str:
    values = list(values)
    return f"{min(values):.1%}-{max(values):.1%}"


def report(a: dict, b: dict, names: tuple[str, str]) -> str:
    rep = repeatability(a, b)
    lines = [f"Measurement A `{names[0]}` ({a['date']}), B `{names[1]}` ({b['date']}): engine {a['profile']['engine']}, "
             f"model {a['args']['model']}, machine {a['machine']}; the steps both ran (step 0 left out). *engine* is "
             "the median over a run's rounds of |B / A - 1| of the measured rollout (the same requests); *simulator* "
             "the median per-round error of each measurement's own prediction.", "",
             "| policy | seed | rounds | engine: B against A | simulator: A, B | sync/policy measured A, B (B against A) "
             "| predicted error A, B |", "|---|---|---|---|---|---|---|"]
    for (policy, seed), r in rep.items():
        (ra, rb), sim = r["ratio"], r["simulator"]
        ratio = (f"{ra[0]:.2f}, {rb[0]:.2f} ({error(ra[0], rb[0]):+.1%}) | {error(*ra):+.1%}, {error(*rb):+.1%}"
                 if policy != "sync" and ra and rb else "- | -")
        lines.append(f"| {policy} | {seed} | {r['rounds']} | {r['engine']:.1%} | {sim[0]:.1%}, {sim[1]:.1%} | {ratio} |")
    lines += ["", summary_line(rep)]
    return "\n".join(lines) + "\n"


def summary_line(rep: dict) -> str:
    """Per policy: the engine against itself beside the simulator against each measurement."""
    parts = []
    for policy in dict.fromkeys(p for p, _ in rep):
        runs = [r for (p, _), r in rep.items() if p == policy]
        text = (f"{policy}: rounds, the engine against itself {span(r['engine'] for r in runs)}, the simulator "
                f"{span(s for r in runs for s in r['simulator'])}")
        ratios = [r["ratio"] for r in runs if policy != "sync" and r["ratio"][0] and r["ratio"][1]]
        if ratios:
            text += (f"; sync/{policy} measured, B against A {span(abs(error(x[0], y[0])) for x, y in ratios)}, "
                     f"predicted against measured {span(abs(error(*m)) for pair in ratios for m in pair)}")
        parts.append(text)
    return "Per run (median over its rounds): " + "; ".join(parts) + "."


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path, help="a result of benchmarks/sim_vs_real.py (JSON, or its run directory)")
    ap.add_argument("b", type=Path)
    ap.add_argument("--write-results", action="store_true", help="write the table into RESULTS.md")
    args = ap.parse_args(argv)
    paths = [p / "result.json" if p.is_dir() else p for p in (args.a, args.b)]
    for p in paths:
        if not p.exists():
            ap.error(f"{p}: no such result")
    a, b = (json.loads(p.read_text()) for p in paths)
    try:
        text = report(a, b, (paths[0].name, paths[1].name))
    except ValueError as exc:
        ap.error(str(exc))
    print(text)
    if args.write_results:
        write_section("Simulator against real engines", text,
                      subsection=f"{a['profile']['engine']}, {a['args']['model']} model, the engine against itself")


if __name__ == "__main__":
    main()
