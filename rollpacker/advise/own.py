"""rollpacker's own logs: a run's `metrics.jsonl` (its step records hold every request's prompt, token
count and finish reason, and the rollout's seconds) or a workload file the simulator reads
(`{"prompt": id, "lengths": [...]}` lines, rollpacker/sim/workloads.py)."""

from __future__ import annotations

from pathlib import Path

from .readers import json_lines, number
from .records import AdviseError, ImportedLog, Sample, StepTimes

SHAPE = 'rollpacker metrics.jsonl step records (with "requests") or workload lines {"prompt": id, "lengths": [...]}'


def read_own(path: Path) -> ImportedLog:
    samples, times, aborted = [], [], 0
    for lineno, row in json_lines(path, SHAPE):
        if "requests" in row:
            step = int(row.get("step", 0))
            for prompt, num_tokens, reason, *_ in row["requests"]:
                if reason == "abort":  # its full length is unknown (censored); counted below
                    aborted += 1
                    continue
                samples.append(Sample(step=step, group=f"{step}/{prompt}", tokens=int(num_tokens), reason=str(reason)))
            times.append(StepTimes(step, gen_s=number(row.get("rollout_s")), step_s=number(row.get("step_s"))))
        elif "lengths" in row and "prompt" in row:
            samples.extend(_workload_samples(row, f"{path}:{lineno}"))
        else:
            raise AdviseError(f"{path}:{lineno}: neither a step record with \"requests\" nor a workload line; expected {SHAPE}")
    if not samples:
        raise AdviseError(f"{path}: no request lengths (expected {SHAPE})")
    notes = (f"{aborted} aborted requests left out (their full length is unknown)",) if aborted else ()
    return ImportedLog(source="rollpacker metrics.jsonl" if times else "rollpacker workload file",
                       samples=tuple(samples), times=tuple(times), notes=notes)


def _workload_samples(row: dict, where: str) -> list[Sample]:
    step, lengths = row.get("step", 0), row["lengths"]
    reasons = row.get("finish_reasons") or [None] * len(lengths)
    if not isinstance(lengths, list) or not all(isinstance(n, int) and n >= 0 for n in lengths) or len(reasons) != len(lengths):
        raise AdviseError(f"{where}: \"lengths\" must be a list of integers >= 0 (and \"finish_reasons\" one per length)")
    return [Sample(step=int(step), group=f"{step}/{row['prompt']}", tokens=n, reason=r, prompt_tokens=row.get("prompt_tokens"))
            for n, r in zip(lengths, reasons)]
