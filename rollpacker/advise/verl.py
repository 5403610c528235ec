"""veRL's logs.

Rollout dumps (`trainer.rollout_data_dir`): `<dir>/<global_step>.jsonl`, one line per trained
trajectory: `input` and `output` (decoded text, EOS stripped), `gts`, `score`, `step`, and `uid`
(`<prompt-uid>_<session>_<index>`; older versions: the prompt's uid alone) or `request_id`.  Siblings
are the lines of one step that share the uid's prompt part, or else the same `input`.  A line may carry
its token count instead (`response_length`, `num_tokens` or `output_tokens`): it is used as is.

The `file` logger: `{"step": N, "data": {...}}` lines with `response_length/{mean,max,min,clip_ratio}`,
`prompt_length/mean`, `timing_s/gen`, `timing_s/step` and, with the agent loop,
`agent_loop/generate_sequences/{max,mean}`.
"""

from __future__ import annotations

import re
from pathlib import Path

from .readers import json_lines, step_rows
from .records import AdviseError, ImportedLog, Sample

DUMP_SHAPE = 'veRL rollout dump lines: {"input": ..., "output": ..., "step": N, "uid": ...}'
METRICS_SHAPE = 'veRL file-logger lines: {"step": N, "data": {"response_length/mean": ...}}'
TOKEN_FIELDS = ("response_length", "num_tokens", "output_tokens")
UID = re.compile(r"^(.*)_(\d+)_(\d+)$")
"""`<prompt-uid>_<session>_<index>`: the prompt's part is the group."""

METRIC_KEYS = {
    "mean": "response_length/mean", "max": "response_length/max", "min": "response_length/min",
    "clip_ratio": "response_length/clip_ratio", "prompt_mean": "prompt_length/mean",
    "gen_s": "timing_s/gen", "step_s": "timing_s/step",
    "agent_max": "agent_loop/generate_sequences/max", "agent_mean": "agent_loop/generate_sequences/mean",
}


def dump_files(path: Path) -> list[Path]:
    """The dump's `<step>.jsonl` files (a directory) or the one file given."""
    if path.is_file():
        return [path]
    files = sorted((p for p in path.glob("*.jsonl") if p.stem.isdigit()), key=lambda p: int(p.stem))
    if not files:
        raise AdviseError(f"{path}: no <step>.jsonl file (veRL's trainer.rollout_data_dir holds one per step)")
    return files


def read_dump(path: Path) -> ImportedLog:
    samples: list[Sample] = []
    files = dump_files(path)
    for file in files:
        samples.extend(_dump_sample(row, file, lineno) for lineno, row in json_lines(file, DUMP_SHAPE))
    if not samples:
        raise AdviseError(f"{path}: no trajectory lines (expected {DUMP_SHAPE})")
    return ImportedLog(source=f"veRL rollout dump ({len(files)} file{'s' * (len(files) > 1)})", samples=tuple(samples))


def _dump_sample(row: dict, file: Path, lineno: int) -> Sample:
    where = f"{file}:{lineno}"
    step = row.get("step", int(file.stem) if file.stem.isdigit() else None)
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise AdviseError(f"{where}: no step (a \"step\" field, or the file named <step>.jsonl)")
    tokens = next((row[k] for k in TOKEN_FIELDS if k in row), None)
    if tokens is not None and (not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0):
        raise AdviseError(f"{where}: token count {tokens!r} is not an integer >= 0")
    output = row.get("output")
    if tokens is None and not isinstance(output, str):
        raise AdviseError(f"{where}: missing field 'output' (the decoded response) or a token count "
                          f"({', '.join(TOKEN_FIELDS)}); expected {DUMP_SHAPE}")
    prompt = row.get("input") if isinstance(row.get("input"), str) else None
    return Sample(step=step, group=f"{step}/{_group_key(row, prompt, where)}", prompt=prompt,
                  output=output if tokens is None else None, tokens=tokens)


def _group_key(row: dict, prompt: str | None, where: str) -> str:
    """The prompt part of `uid`, else the `input` text itself."""
    uid = row.get("uid")
    if isinstance(uid, str) and uid:
        match = UID.match(uid)
        return "uid:" + (match.group(1) if match else uid)
    if prompt is None:
        raise AdviseError(f"{where}: no 'uid' and no 'input' to group a prompt's samples by; expected {DUMP_SHAPE}")
    return "input:" + prompt


def read_metrics(path: Path) -> ImportedLog:
    rows = []
    for lineno, row in json_lines(path, METRICS_SHAPE):
        step, data = row.get("step"), row.get("data")
        if not isinstance(step, int) or not isinstance(data, dict):
            raise AdviseError(f"{path}:{lineno}: expected {METRICS_SHAPE}")
        rows.append((step, data))
    scalars, times, notes = step_rows(rows, METRIC_KEYS, str(path), METRIC_KEYS["mean"])
    return ImportedLog(source="veRL file logger", scalars=tuple(scalars), times=tuple(times),
                       max_tokens=cap_from_scalars(scalars), notes=tuple(notes))


def cap_from_scalars(scalars) -> int | None:
    """The response cap, where a step clipped some responses: its longest then is the cap."""
    caps = {int(s.max) for s in scalars if s.clip_ratio and s.max}
    return max(caps) if caps else None
