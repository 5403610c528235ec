"""`rollpacker advise`: every supported format read from its fixture (tests/data/advise, written from the
trainers' documented schemas by make_fixtures.py), the advice's table and flags, tier 2 as a range, and
each bad log as one line naming what is missing."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from rollpacker.advise.formats import detect, read_log
from rollpacker.advise.workload import choose_steps, tier1_batch
from rollpacker.cli import main

DATA = Path(__file__).resolve().parent / "data" / "advise"
sys.path.insert(0, str(DATA))
from make_fixtures import CAP, P, R, STEPS, lengths  # noqa: E402

FIXTURES = {"verl": "verl_dump", "verl-metrics": "verl_metrics.jsonl", "trl": "trl", "trl-state": "trl_state",
            "wandb": "wandb_history.csv", "rollpacker": "rollpacker_metrics.jsonl"}
TIER_1 = ("verl", "trl", "rollpacker")
SMALL = ["--gpus", "1", "--model", "7b", "--seeds", "0", "--jobs", "1", "--no-progress"]


@pytest.fixture(scope="module")
def tokenizer():
    from rollpacker.advise.tokens import load_tokenizer

    return load_tokenizer(None)[0]


@pytest.mark.parametrize("fmt", list(FIXTURES))
def test_each_format_is_detected_and_read(fmt, tokenizer):
    path = DATA / FIXTURES[fmt]
    assert detect(path) == fmt
    log = read_log(path)
    assert log.steps == list(range(1, STEPS + 1))
    if fmt not in TIER_1:
        assert log.tier == 2 and all(s.mean > 0 and s.max <= CAP for s in log.scalars)
        assert all(t.gen_s for t in log.times)  # the generation time to calibrate with
        return
    batch = tier1_batch(log, log.steps, CAP, tokenizer)
    assert (batch.prompts, batch.samples) == (P, R)
    # the text re-tokenized plus the stripped EOS gives back every length, siblings grouped
    got = sorted((g.step, sorted(g.lengths)) for g in batch.groups)
    assert got == sorted((step, sorted(v)) for (step, _), v in lengths().items())
    assert all((n >= CAP) == (r == "length") for g in batch.groups for n, r in zip(g.lengths, g.reasons))


def test_tier_1_prints_the_table_the_flags_and_writes_the_plot(tmp_path, capsys):
    """A veRL dump, its engine calibrated on the same run's file-logger times (--times); the cap comes from there too."""
    out = tmp_path / "advice"
    assert main(["advise", str(DATA / "verl_dump"), "--times", str(DATA / "verl_metrics.jsonl"), "--out", str(out),
                 *SMALL]) == 0
    text = capsys.readouterr().out
    for needle in ("whole step gain", "rollout gain", "wasted tokens", "kept length", "on-policy", "Recommendation:",
                   "calibrated: the log's generation takes 1.2 s", "calibration check:", f"max tokens {CAP}"):
        assert needle in text
    assert "--policy" in text or "keep sync" in text
    advice = json.loads((out / "advice.json").read_text())
    assert {o["label"] for o in advice["outcomes"]} >= {"sync", "tail", "sorted", "partial"}
    assert (out / "advice.png").stat().st_size > 1000 and (out / "workload.jsonl").is_file()


def test_tier_2_gives_a_range_never_a_point_and_calibrates_to_the_generation_time(tmp_path, capsys):
    out = tmp_path / "advice"
    assert main(["advise", str(DATA / "verl_metrics.jsonl"), "--prompts", str(P), "--samples", str(R),
                 "--out", str(out), "--no-plot", *SMALL]) == 0
    text = capsys.readouterr().out
    assert "range over 0.15, 0.5, 0.9" in text and "calibrated:" in text and "agent loop:" in text
    rows = [line for line in text.splitlines() if line.startswith(("tail", "sorted", "partial"))]
    assert len(rows) == 6
    for row in rows:  # each gain a range "a-bx", no median
        cells = row.split("  ")
        assert "(" not in row and any(c.strip().endswith("x") and "-" in c for c in cells), row
    assert len(list(out.glob("workload-between-*.jsonl"))) == 3


def advise_error(capsys, *args: str) -> str:
    assert main(["advise", *args, *SMALL]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_an_unknown_format_names_format(tmp_path, capsys):
    path = tmp_path / "notes.txt"
    path.write_text("hello\n")
    assert "--format verl|verl-metrics|trl" in advise_error(capsys, str(path), "--out", str(tmp_path / "o"))


def test_a_dump_line_without_its_output_names_the_field_and_line(tmp_path, capsys):
    dump = tmp_path / "dump"
    shutil.copytree(DATA / "verl_dump", dump)
    lines = (dump / "2.jsonl").read_text().splitlines()
    row = json.loads(lines[3])
    del row["output"]
    (dump / "2.jsonl").write_text("\n".join(lines[:3] + [json.dumps(row)] + lines[4:]) + "\n")
    err = advise_error(capsys, str(dump), "--max-tokens", str(CAP), "--out", str(tmp_path / "o"))
    assert "2.jsonl:4" in err and "'output'" in err


def test_one_step_is_refused(tmp_path, capsys):
    dump = tmp_path / "dump"
    dump.mkdir()
    shutil.copy(DATA / "verl_dump" / "1.jsonl", dump / "1.jsonl")
    err = advise_error(capsys, str(dump), "--max-tokens", str(CAP), "--out", str(tmp_path / "o"))
    assert "1 step" in err and "at least 2" in err


def test_a_cap_lower_than_the_lengths_names_max_tokens(tmp_path, capsys):
    err = advise_error(capsys, str(DATA / "rollpacker_metrics.jsonl"), "--max-tokens", "100", "--out", str(tmp_path / "o"))
    assert "--max-tokens 100 is lower than" in err
    err = advise_error(capsys, str(DATA / "verl_metrics.jsonl"), "--prompts", "4", "--samples", "4",
                       "--max-tokens", "100", "--out", str(tmp_path / "o"))
    assert "--max-tokens 100 is lower than" in err


def test_step_scalars_without_the_batch_size_name_prompts_and_samples(tmp_path, capsys):
    err = advise_error(capsys, str(DATA / "trl_state"), "--max-tokens", str(CAP), "--out", str(tmp_path / "o"))
    assert "--prompts P --samples R" in err


def test_a_missing_cap_names_max_tokens(tmp_path, capsys):
    assert "pass --max-tokens" in advise_error(capsys, str(DATA / "trl"), "--out", str(tmp_path / "o"))


def test_a_tokenizer_that_cannot_load_names_tokenizer(tmp_path, capsys):
    err = advise_error(capsys, str(DATA / "trl"), "--max-tokens", str(CAP), "--tokenizer", "no-such-org/no-such-model",
                       "--out", str(tmp_path / "o"))
    assert "--tokenizer 'no-such-org/no-such-model'" in err and "nothing is downloaded" in err


def test_the_window_spreads_over_the_run():
    assert choose_steps(list(range(100)), 4) == [0, 33, 66, 99]
    assert choose_steps([3, 5], 4) == [3, 5]
