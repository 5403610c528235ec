"""A measured run's rounds request by request, beside the simulator's: when each request was launched and
when its answer reached the driver, on the engine and in the simulation of the same run (the profile and
stages it was measured with).  Where a policy's rounds are predicted short or long, this says at which
requests the time goes: the first answers, the refills' launches, the aborts, the round's last answer.

    .venv/bin/python benchmarks/sim_vs_real_timeline.py DIR --policy sorted --seed 1 [--steps 3,4]

DIR: a `benchmarks/sim_vs_real.py --out DIR` whose runs kept their step records (DIR/POLICY-SEED/metrics.jsonl,
with `request_spans`: a run measured after they were recorded).  Requests are matched by (prompt, k): the k-th
request of a prompt over the run, which the replay gives the same length on both sides; where the two sides
launched it in different steps, the step's row has the measured side alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_vs_real_predict import Workload, instances_of, predict  # noqa: E402

from rollpacker.sim.engine_profile import EngineProfile  # noqa: E402
from rollpacker.sim.simulation import Simulation  # noqa: E402


class TimedSimulation(Simulation):
    """The simulator, keeping each request's launch and answer (seconds from its step's start) by step."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.spans: dict[int, dict[str, list]] = {}

    def _here(self) -> dict[str, list]:
        return self.spans.setdefault(self.sched.state.step, {})

    def launch(self, launches) -> None:
        for cmd in launches:
            self._here()[cmd.request_id] = [self.now - self.step_start, None, cmd.prompt.index]
        super().launch(launches)

    def _answer(self, at: float, event) -> None:
        self._here()[event.request_id][1] = max(at, self.now) - self.step_start
        super()._answer(at, event)


def measured_steps(records: list[dict]) -> list[dict[tuple, tuple]]:
    """Per measured step record: (prompt, k) -> (launch, answer, tokens, finish reason, id)."""
    if any("request_spans" not in r for r in records):
        raise SystemExit("this run's step records have no request_spans: measure it again with this tree")
    return keyed([sorted(((span[0], q[3]), (q[0], *span, q[1], q[2], q[3])) for q, span in
                         zip(r["requests"], r["request_spans"])) for r in records])


def simulated_steps(spans: dict[int, dict[str, list]], steps: int) -> list[dict[tuple, tuple]]:
    """Per simulated step: (prompt, k) -> (launch, answer, id), from `TimedSimulation.spans`."""
    return keyed([[((launch, rid), (prompt, launch, answer, rid)) for rid, (launch, answer, prompt) in
                   spans.get(step, {}).items()] for step in range(steps)])


def keyed(steps: list[list[tuple]]) -> list[dict[tuple, tuple]]:
    """Each step's requests ((order, (prompt, *rest)) in launch order) keyed by (prompt, k), k counting a
    prompt's requests over the run."""
    seen: dict[int, int] = {}
    out = []
    for step in steps:
        out.append({})
        for _, (prompt, *rest) in step:
            k = seen[prompt] = seen.get(prompt, -1) + 1
            out[-1][prompt, k] = tuple(rest)
    return out


def simulated(result: dict, policy: str, seed: int) -> TimedSimulation:
    args = argparse.Namespace(**result["args"])
    path = Path(tempfile.mkdtemp(prefix="rollpacker-timeline-")) / "profile.json"
    holder = {}

    def keep(*a, **k):
        holder["sim"] = TimedSimulation(*a, **k)
        return holder["sim"]

    predict(args, path, policy, seed, Workload(args.workload, args.scale_from), args.steps, result["stages"],
            result["micro_batch_tokens"], instances_of(args), EngineProfile(**result["profile"]),
            simulation=keep)
    return holder["sim"]


def rows(real: dict[tuple, tuple], sim: dict[tuple, tuple]) -> list[tuple]:
    """((prompt, k), launch real, launch sim, answer real, answer sim, tokens real, reason real) of one step, in
    the real launch order (None where the simulation did not launch that request in that step)."""
    return [(key, r[0], sim.get(key, (None,))[0], r[1], sim.get(key, (None, None))[1], r[2], r[3])
            for key, r in real.items()]


def offsets(table: list[tuple], which: str) -> list[float]:
    """Answer (or launch) time real - simulated of the matched requests of one kind: 'first' launches (at
    the round's start), 'refill' launches (later), 'stop' / 'abort' answers."""
    if which in ("first", "refill"):
        start = min(t[1] for t in table)
        return [t[1] - t[2] for t in table if t[2] is not None and (t[1] - start < 0.005) == (which == "first")]
    return [t[3] - t[4] for t in table if t[4] is not None and (t[6] == "abort") == (which == "abort")]


def report(result: dict, out: Path, policy: str, seed: int, steps: list[int] | None) -> str:
    records = [json.loads(line) for line in (out / f"{policy}-{seed}" / "metrics.jsonl").read_text().splitlines()]
    real, sim = measured_steps(records), simulated_steps(simulated(result, policy, seed).spans, len(records))
    lines, summary = [], {k: [] for k in ("first", "refill", "stop", "abort")}
    for record in records[1:]:
        step = record["step"]
        table = rows(real[step], sim[step])
        for kind in summary:
            summary[kind] += offsets(table, kind)
        if steps is None or step in steps:
            lines += [f"step {step} ({record['round']}): rollout {record['rollout_s']:.3f} s measured; "
                      "(prompt, k) | launch real / sim | answer real / sim | tokens | reason"]
            lines += [f"  {key} | {a:.3f} / {fmt(b)} | {c:.3f} / {fmt(d)} | {n} | {why}" for key, a, b, c, d, n, why in table]
    lines.append(f"{policy} seed {seed}, steps 1-{records[-1]['step']}: real - simulated, median (count)")
    lines += [f"  {kind:6s} {'launch' if kind in ('first', 'refill') else 'answer'}: "
              f"{statistics.median(v) * 1e3:+.1f} ms ({len(v)})" for kind, v in summary.items() if v]
    return "\n".join(lines)


def fmt(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="a benchmarks/sim_vs_real.py --out directory")
    ap.add_argument("--policy", default="sorted")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", default=None, help="comma-separated steps to list request by request (default: all)")
    args = ap.parse_args(argv)
    out = Path(args.dir)
    result = json.loads((out / "result.json").read_text())
    print(report(result, out, args.policy, args.seed, [int(s) for s in args.steps.split(",")] if args.steps else None))


if __name__ == "__main__":
    main()
