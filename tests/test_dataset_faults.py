"""--dataset files at the edges: a valid parquet file with no rows, a file of blank lines, a
directory, a file that is not parquet; each is one line saying what it is (not "cannot be read",
not "no such file"), with nothing else printed."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollpacker.core.errors import ConfigError
from rollpacker.train.config import parse
from test_reference_train import ROOT, tiny_model  # noqa: F401 - fixture

TRAIN = ROOT / "reference" / "train.py"


def bad_files(tmp):
    """name -> (path, the one line's text after "--dataset PATH: ")."""
    empty = tmp / "empty.parquet"
    pq.write_table(pa.table({"prompt": pa.array([], pa.string()), "data_source": pa.array([], pa.string())}), empty)
    (tmp / "blank.jsonl").write_text("\n  \n\n")
    (tmp / "folder.parquet").mkdir()
    (tmp / "data").mkdir()
    (tmp / "garbage.parquet").write_bytes(b"not a parquet file at all")
    return {
        "parquet with 0 rows": (empty, "the file holds no rows (a valid parquet file with 0 rows)"),
        "blank lines": (tmp / "blank.jsonl", "the file holds no rows (only blank lines)"),
        "directory named .parquet": (tmp / "folder.parquet", "is a directory; give the .jsonl or .parquet file in it"),
        "directory": (tmp / "data", "is a directory; give the .jsonl or .parquet file in it"),
        "not parquet": (tmp / "garbage.parquet", "cannot be read as parquet (Parquet magic bytes not found"),
    }


def test_a_dataset_that_is_empty_or_a_directory_says_so_in_one_line(tmp_path, capfd):
    """The issue's cases: a valid parquet with 0 rows was "cannot be read as parquet" (after a line
    `datasets` logged), a directory was "no such file"."""
    for name, (path, what) in bad_files(tmp_path).items():
        config = parse(["--preset", "tiny_debug", "--trainer", "torch", "--device", "cpu", "--dataset", str(path)])
        with pytest.raises(ConfigError) as caught:
            config.validate()
        assert str(caught.value).startswith(f"--dataset {path}: {what}"), (name, str(caught.value))
        assert "\n" not in str(caught.value), name
        assert capfd.readouterr().err == "", name  # nothing logged beside the one line


@pytest.mark.timeout(120)
def test_the_trainer_says_a_directory_is_one_before_any_model_loads(tmp_path, tiny_model):  # noqa: F811
    proc = subprocess.run([sys.executable, str(TRAIN), "--preset", "tiny_debug", "--model", str(tiny_model),
                           "--out", str(tmp_path / "run"), "--dataset", str(tmp_path)],
                          capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip() == f"error: --dataset {tmp_path}: is a directory; give the .jsonl or .parquet file in it"


def test_a_row_without_a_key_mid_file_is_one_line_naming_its_row_line_and_key(tmp_path):
    """Row 0 without the answer was named; a later row was `cannot be read as json ('answer')`
    (`datasets`' KeyError), with no row and the wrong cause.  A key outside the layout that other
    rows hold is named too, with the way out."""
    first, second = '{"q": "a", "answer": "1", "hint": "h"}', '{"q": "b", "answer": "2", "hint": null}'
    cases = {
        "answer": ([first, second, '{"q": "c", "hint": "h"}'], "key 'answer' (--answer-key) is missing"),
        "hint": ([first, second, '{"q": "d", "answer": "4"}'], "key 'hint' is missing (other rows hold it: give "
                                                               "it null here)"),
    }
    for name, (lines, what) in cases.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(line + "\n" for line in lines))
        config = parse(["--preset", "tiny_debug", "--trainer", "torch", "--device", "cpu", "--dataset", str(path),
                        "--prompt-key", "q", "--answer-key", "answer"])
        with pytest.raises(ConfigError) as caught:
            config.validate()
        assert str(caught.value) == f"--dataset {path} row 2 (line 3): {what}", name
