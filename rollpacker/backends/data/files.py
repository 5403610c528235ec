"""`--dataset PATH`: the user's JSONL or Parquet file as `PromptRow`s, read with Hugging Face
`datasets`, in one of the two layouts RL users bring.

    verl   (default)  prompt: list of chat messages, data_source, reward_model.ground_truth,
                      extra_info (optional): veRL's RL parquet, as its data preprocessors write it
    plain  (--prompt-key K --answer-key A)  K: text or chat messages, A: the ground truth; the
                      row's other columns become extra_info, data_source is the file's stem
                      unless the row has a data_source column

Rows count from 0, as `datasets` indexes them.  A missing key, an empty prompt, an empty file or a
line that is not JSON is a `DatasetError` naming the file, the row (and a JSONL file's line) and the
key; nothing is dropped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attrs import frozen

from rollpacker.backends.data.rows import PromptRow
from rollpacker.core.errors import ConfigError

FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


class DatasetError(ConfigError):
    """The --dataset file cannot be used; names the file, and the row and key when it is one row."""


@frozen
class Layout:
    """Which keys of a row hold the prompt and the ground truth (None: veRL's layout)."""

    prompt_key: str | None = None
    answer_key: str | None = None

    @property
    def name(self) -> str:
        return "verl" if self.prompt_key is None else "plain"

    @property
    def needed(self) -> tuple[str, ...]:
        """The top-level keys every row must hold."""
        return ("prompt", "data_source", "reward_model") if self.prompt_key is None else \
            (self.prompt_key, self.answer_key)

    def key_name(self, key: str) -> str:
        """`key` quoted, with the flag that named it: 'answer' (--answer-key)."""
        flag = {self.prompt_key: " (--prompt-key)", self.answer_key: " (--answer-key)"}.get(key, "")
        return f"{key!r}{flag}"


def read_rows(path: str | Path, layout: Layout = Layout()) -> list[PromptRow]:
    """Every row of `path` as a PromptRow (errors name the file, row and key)."""
    path = Path(path)
    table = _load(path, layout)
    if len(table) == 0:
        raise DatasetError(f"--dataset {path}: the file holds no rows")
    for key in layout.needed:
        if key not in table.column_names:
            raise DatasetError(f"--dataset {path} row 0: key {layout.key_name(key)} is missing; columns: "
                               f"{', '.join(table.column_names)}" + _layout_hint(layout))
    to_row = _verl_row if layout.prompt_key is None else _plain_row
    return [to_row(record, f"{path} row {i}", path, layout) for i, record in enumerate(table)]


def _load(path: Path, layout: Layout):
    """The file as a `datasets.Dataset` (kept in memory; its cache goes to rollpacker's folder)."""
    if path.is_dir():
        raise DatasetError(f"--dataset {path}: is a directory; give the .jsonl or .parquet file in it")
    if not path.is_file():
        raise DatasetError(f"--dataset {path}: no such file")
    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        raise DatasetError(f"--dataset {path}: unknown format {path.suffix!r}; use .jsonl or .parquet")
    if path.stat().st_size == 0:
        raise DatasetError(f"--dataset {path}: the file holds no rows")
    try:
        import datasets
    except ImportError:
        raise DatasetError(f"--dataset {path}: reading a file needs Hugging Face `datasets`, which does not "
                           f"import here (pip install datasets); --tasks needs no file") from None

    from rollpacker.backends.models import cache_dir

    if kind == "parquet" and _parquet_rows(path) == 0:
        raise DatasetError(f"--dataset {path}: the file holds no rows (a valid parquet file with 0 rows)")
    datasets.disable_progress_bars()
    try:
        return datasets.load_dataset(kind, data_files=str(path), split="train", keep_in_memory=True,
                                     cache_dir=str(cache_dir() / "datasets"))
    except Exception as exc:  # noqa: BLE001 - pyarrow's errors name no row: find it ourselves
        raise DatasetError(_read_failure(path, kind, exc, layout)) from None


def _parquet_rows(path: Path) -> int:
    """The row count in a parquet file's footer (read before `datasets`, which logs and fails on a
    file that is not parquet, or has no rows, with no word of why)."""
    import pyarrow.parquet as pq

    try:
        return pq.read_metadata(path).num_rows
    except Exception as exc:  # noqa: BLE001 - pyarrow's errors for a file that is not parquet vary
        raise DatasetError(_read_failure(path, "parquet", exc)) from None


def _read_failure(path: Path, kind: str, exc: Exception, layout: Layout = Layout()) -> str:
    line = _json_failure(path, exc, layout) if kind == "json" else None
    if line is not None:
        return line
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"--dataset {path}: cannot be read as {kind} ({reason})"


def _json_failure(path: Path, exc: Exception, layout: Layout) -> str | None:
    """The first line of a JSON-lines file that `datasets` cannot read, named (its errors name no
    line): blank, not JSON, not an object, or a row without a top-level key other rows have (its
    KeyError; `datasets` reads every row with every row's keys)."""
    text = path.read_text(errors="replace")
    if not text.strip():
        return f"--dataset {path}: the file holds no rows (only blank lines)"
    missing = exc.args[0] if isinstance(exc, KeyError) and exc.args else None
    row = 0
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as bad:
            return f"--dataset {path} line {number}: not valid JSON ({bad.msg})"
        if not isinstance(record, dict):
            return f"--dataset {path} line {number}: not a JSON object"
        if missing is not None and missing not in record:
            fix = "" if missing in layout.needed else " (other rows hold it: give it null here)"
            return f"--dataset {path} row {row} (line {number}): key {layout.key_name(missing)} is missing{fix}"
        row += 1
    return None


def _layout_hint(layout: Layout) -> str:
    if layout.prompt_key is None:
        return " (veRL layout: prompt, data_source, reward_model.ground_truth; or pass --prompt-key and --answer-key)"
    return ""


def _verl_row(record: Mapping[str, Any], where: str, path: Path, layout: Layout) -> PromptRow:
    reward_model = record.get("reward_model")
    if not isinstance(reward_model, Mapping) or reward_model.get("ground_truth") is None:
        raise DatasetError(f"--dataset {where}: key 'reward_model.ground_truth' is missing")
    source = record.get("data_source")
    if not isinstance(source, str) or not source:
        raise DatasetError(f"--dataset {where}: key 'data_source' is missing or not a string")
    extra = record.get("extra_info")
    return PromptRow(messages=_messages(record.get("prompt"), where, "prompt"), data_source=source,
                     ground_truth=reward_model["ground_truth"],
                     extra_info=dict(extra) if isinstance(extra, Mapping) else {}, where=where)


def _plain_row(record: Mapping[str, Any], where: str, path: Path, layout: Layout) -> PromptRow:
    answer = record.get(layout.answer_key)
    if answer is None:
        raise DatasetError(f"--dataset {where}: key {layout.answer_key!r} (--answer-key) is missing")
    source = record.get("data_source")
    extra = {k: v for k, v in record.items() if k not in (layout.prompt_key, layout.answer_key)}
    return PromptRow(messages=_messages(record.get(layout.prompt_key), where, layout.prompt_key),
                     data_source=source if isinstance(source, str) and source else path.stem,
                     ground_truth=answer, extra_info=extra, where=where)


def _messages(value: Any, where: str, key: str) -> tuple[dict, ...]:
    """A prompt value as chat messages: a non-empty string is one user message; a list must hold
    {"role", "content"} string pairs."""
    if isinstance(value, str):
        if not value.strip():
            raise DatasetError(f"--dataset {where}: key {key!r} is empty")
        return ({"role": "user", "content": value},)
    if not isinstance(value, (list, tuple)) or not value:
        raise DatasetError(f"--dataset {where}: key {key!r} is missing or empty (expected text or a list of "
                           f"chat messages)")
    messages = []
    for n, m in enumerate(value):
        if not (isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise DatasetError(f"--dataset {where}: key {key!r} message {n} is not "
                               f"{{'role': str, 'content': str}}")
        messages.append({"role": m["role"], "content": m["content"]})
    return tuple(messages)
