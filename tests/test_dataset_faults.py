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
