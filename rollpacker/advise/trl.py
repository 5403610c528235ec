"""TRL's GRPOTrainer logs.

`log_completions=True`: `<output_dir>/completions/completions_<step:05d>.parquet`, columns `step`,
`prompt`, `completion` (text, or a conversation: a list of {"role", "content"}), one column per reward
function and `advantage`; a prompt's `num_generations` siblings are consecutive rows with the same prompt.

`trainer_state.json`: `log_history` rows with `completions/{mean,min,max}_length` and
`completions/clipped_ratio` (averaged over `logging_steps`), `step`, and a generation time where TRL's
profiling logged one (`profiling/Time taken: ...generate...`).
"""

from __future__ import annotations

import json
from pathlib import Path

from .readers import read_table, step_rows
from .records import AdviseError, ImportedLog, Sample

COLUMNS = ("step", "prompt", "completion")
STATE_KEYS = {
    "mean": "completions/mean_length", "max": "completions/max_length", "min": "completions/min_length",
    "clip_ratio": "completions/clipped_ratio",
}


def generate_time(row: dict) -> float | None:
    """TRL's profiling time of generation: the first `profiling/Time taken: ...` key naming generate."""
    for key, value in row.items():
        if key.startswith("profiling/Time taken:") and "generate" in key.lower():
            return value
    return None


STATE_TIME_KEYS = STATE_KEYS | {"gen_s": generate_time}


def completion_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    folder = path / "completions" if (path / "completions").is_dir() else path
    files = sorted(folder.glob("completions_*.parquet"))
    if not files:
        raise AdviseError(f"{path}: no completions/completions_<step>.parquet (TRL writes them with "
                          f"log_completions=True)")
    return files


def read_completions(path: Path) -> ImportedLog:
    samples: list[Sample] = []
    files = completion_files(path)
    for file in files:
        samples.extend(_file_samples(file))
    if not samples:
        raise AdviseError(f"{path}: no completion rows")
    return ImportedLog(source=f"TRL completions ({len(files)} parquet file{'s' * (len(files) > 1)})",
                       samples=tuple(samples))


def _file_samples(file: Path) -> list[Sample]:
    table = read_table(file)
    missing = [c for c in COLUMNS if c not in table.columns]
    if missing:
        raise AdviseError(f"{file}: missing column{'s' * (len(missing) > 1)} {', '.join(map(repr, missing))} "
                          f"(TRL's completions parquet has {', '.join(COLUMNS)})")
    samples, previous, run = [], None, 0
    for index, (step, prompt, completion) in enumerate(zip(table["step"], table["prompt"], table["completion"])):
        prompt_text, output = _text(prompt), _text(completion)
        if output is None:
            raise AdviseError(f"{file}: row {index}: 'completion' is neither text nor a conversation")
        key = json.dumps(prompt_text)
        run = run + 1 if (int(step), key) == previous else 0
        previous = (int(step), key)
        # consecutive rows with one prompt are its siblings; `run` restarts when the prompt changes
        group_start = index - run
        samples.append(Sample(step=int(step), group=f"{int(step)}/{file.stem}/{group_start}", prompt=prompt_text,
                              output=output))
    return samples


def _text(value) -> str | None:
    """A prompt or completion as text: a string, or a conversation's contents joined."""
    if isinstance(value, str):
        return value
    try:
        return "".join(str(m["content"]) for m in value)
    except (TypeError, KeyError):
        return None


def read_state(path: Path) -> ImportedLog:
    file = path / "trainer_state.json" if path.is_dir() else path
    try:
        state = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise AdviseError(f"{file}: not a readable trainer_state.json ({exc})") from None
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        raise AdviseError(f"{file}: no 'log_history' list (TRL's trainer_state.json)")
    rows = [(int(r["step"]), r) for r in history if isinstance(r, dict) and isinstance(r.get("step"), int)]
    scalars, times, notes = step_rows(rows, STATE_TIME_KEYS, str(file), STATE_KEYS["mean"])
    every = state.get("logging_steps")
    if isinstance(every, int) and every > 1:
        notes.append(f"TRL averages its length scalars over logging_steps = {every} steps: each row is fitted as one step")
    return ImportedLog(source="TRL trainer_state.json", scalars=tuple(scalars), times=tuple(times), notes=tuple(notes))
