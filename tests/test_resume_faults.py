"""Faults around a resume and the directories a run writes (docs/faults.md's table lists them):
a state file damaged in place at its size, TensorBoard events after a resume that plays a step
again, and an unusable `--weight-sync disk:DIR`.  Real processes throughout, as in test_faults.py:
the reference trainer on the tiny random Llama, `rollpacker serve` on 127.0.0.1."""

from __future__ import annotations

import json
import os
import shutil
import urllib.request
from pathlib import Path

import pytest

from test_faults import assert_one_clear_line, error_lines, trained_keys
from test_reference_train import records, run_train, tiny_model  # noqa: F401 - fixtures


# -- a damaged state/ (a file cut short, or changed in place at its size): one line naming the file
# and the way out, before anything loads ---------------------------------------------------------

STATE_FILES = ("config.json", "hashes.json", "scheduler.json", "sizes.json", "trainer/.metadata",
               "trainer/__0_0.distcp", "trainer/rollpacker_trainer.json")
"""Every file a 1-step tiny run leaves in state/ (checked against `finished_run`)."""
CONTENT_FILES = ("config.json", "scheduler.json", "trainer/.metadata", "trainer/__0_0.distcp",
                 "trainer/rollpacker_trainer.json")
"""The state files a resume reads (sizes.json and hashes.json describe them)."""


def damage_in_place(path: Path) -> None:
    """Change a file's contents and keep its size: a digit of a JSON file changed to another (still
    valid JSON, so only its contents tell), 4 KiB of a binary file overwritten in the middle."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    if path.suffix == ".json":
        at = next(i for i in range(len(data)) if chr(data[(middle + i) % len(data)]).isdigit())
        at = (middle + at) % len(data)
        data[at] = ord("1") if data[at] != ord("1") else ord("2")  # never a leading 0: valid JSON stays valid
    else:
        start = max(0, middle - 2048)
        data[start:start + 4096] = bytes((b + 1) % 256 for b in data[start:start + 4096])
    size = path.stat().st_size
    path.write_bytes(bytes(data))
    assert path.stat().st_size == size


def cut_in_half(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


DAMAGED = [(cut_in_half, name, ()) for name in STATE_FILES] + [(damage_in_place, name, ("CRC-32",))
                                                                for name in CONTENT_FILES]


def test_the_damaged_state_cases_cover_every_state_file(finished_run):
    state = finished_run / "state"
    assert sorted(str(f.relative_to(state)) for f in state.rglob("*") if f.is_file()) == sorted(STATE_FILES)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("damage,name,says", DAMAGED, ids=[f"{d.__name__}-{n}" for d, n, _ in DAMAGED])
def test_resume_from_a_damaged_state_file_is_one_line_naming_it(finished_run, tmp_path, damage, name, says):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    damaged = out / "state" / name
    damage(damaged)
    proc = run_train("--resume", out, "--steps", 2, check=False, timeout=200)
    assert_one_clear_line(proc, 2, f"--resume {out}", str(damaged), *says, "fresh --out",
                          f"--model {out / 'checkpoints' / 'step_1'}")
    assert "Loading weights" not in proc.stderr and [r["step"] for r in records(out)] == [0]


@pytest.mark.timeout(300)
def test_a_state_saved_before_hashes_existed_is_checked_by_size_with_a_warning(finished_run, tmp_path):
    """Backward compatibility: a state with sizes.json but no hashes.json (an earlier rollpacker)
    resumes, with one warning that its contents are not checked; a cut file is still refused."""
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    state = out / "state"
    (state / "hashes.json").unlink()
    sizes = json.loads((state / "sizes.json").read_text())
    del sizes["hashes.json"]
    (state / "sizes.json").write_text(json.dumps(sizes))
    proc = run_train("--resume", out, "--steps", 1, timeout=100)
    assert "nothing to do" in proc.stdout and not error_lines(proc.stderr), proc.stderr[-3000:]
    (warning,) = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert str(state) in warning and "sizes are checked, not their contents" in warning
    scheduler = state / "scheduler.json"
    scheduler.write_text(scheduler.read_text()[:-1])
    proc = run_train("--resume", out, "--steps", 1, check=False, timeout=100)
    assert_one_clear_line(proc, 2, str(scheduler), "cut short")


# -- TensorBoard after a resume that plays a step again: each step once, equal to metrics.jsonl -----

def tensorboard_events(run_dir: Path) -> dict[str, list[tuple[int, float, float]]]:
    """Every scalar in the event files, read back raw: tag -> [(step, value, wall time)] in file order."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util.tensor_util import make_ndarray

    events: dict[str, list[tuple[int, float, float]]] = {}
    for file in sorted((run_dir / "tensorboard").glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(file)).Load():  # scalars read as tensors (the loader's data_compat)
            for value in event.summary.value:
                events.setdefault(value.tag, []).append((event.step, make_ndarray(value.tensor).item(),
                                                         event.wall_time))
    return events


def assert_events_equal_metrics(run_dir: Path) -> dict[str, list[tuple[int, float, float]]]:
    events = tensorboard_events(run_dir)
    rs = records(run_dir)
    for tag in ("step", "step_s", "mean_reward", "generated_tokens", "kept_tokens"):
        assert [step for step, _, _ in events[tag]] == [r["step"] for r in rs], f"{tag}: a step shows twice"
        assert [value for _, value, _ in events[tag]] == pytest.approx([r[tag] for r in rs], rel=1e-6), tag
    return events


@pytest.mark.timeout(600)
def test_tensorboard_shows_each_step_once_after_a_full_disk_and_a_resume(full_disk_then_resumed):
    """The save of step 1 fails (the disk is full: step 1 is logged, not saved); the resume plays
    step 1 again.  Step 0 keeps the wall time it was first logged at.  (The run of tests/conftest.py's
    `full_disk_then_resumed`, whose failed save's line and kept state test_faults.py checks.)"""
    seen = full_disk_then_resumed
    out = seen["out"]
    (first_step_0,) = seen["events_before"]["step_s"]
    assert_one_clear_line(seen["failed"], 2, "saving the state of step 2")
    assert [step for step, _, _ in seen["events_after_failure"]["step_s"]] == [0, 1]
    assert seen["resumed"].returncode == 0
    assert [r["step"] for r in records(out)] == [0, 1]
    events = assert_events_equal_metrics(out)
    assert events["step_s"][0] == first_step_0


@pytest.mark.timeout(600)
def test_tensorboard_shows_each_step_once_after_a_step_whose_rewards_all_failed(all_rewards_none_run, tmp_path):
    """The run of tests/conftest.py's `all_rewards_none_run` (test_faults.py checks its one line and
    record), on a copy: its step 0 played again on reward 0."""
    out = tmp_path / "run"
    shutil.copytree(all_rewards_none_run["out"], out)
    assert_one_clear_line(all_rewards_none_run["proc"], 2, "step 0: every reward failed")
    run_train("--resume", out, "--allow-failed-rewards", timeout=200)  # step 0 again, on reward 0
    assert [r["step"] for r in records(out)] == [0]
    assert_events_equal_metrics(out)


# -- --weight-sync disk:DIR: checked before any model loads, and only the newest copy kept ---------

@pytest.mark.timeout(120)
@pytest.mark.parametrize("where,needle", [("missing-parent", "does not exist"), ("/proc/rollpacker-weights",
                                                                                 "cannot write there")])
def test_an_unusable_weight_sync_dir_is_one_line_before_any_model_loads(tiny_model, tmp_path, where, needle):
    weights = tmp_path / "not-mounted" / "weights" if where == "missing-parent" else Path(where)
    proc = run_train("--preset", "tiny_debug", "--model", tiny_model, "--out", tmp_path / "run", "--rollout", "sglang",
                     "--sglang-urls", "http://127.0.0.1:9", "--weight-sync", f"disk:{weights}", check=False,
                     timeout=100)
    assert_one_clear_line(proc, 2, f"--weight-sync disk:{weights}", needle)
    assert "Loading weights" not in proc.stderr and not weights.exists()


@pytest.mark.timeout(400)
def test_weight_sync_disk_keeps_only_the_newest_copy(tiny_model, tmp_path):
    """Two steps against a `rollpacker serve` server through disk:DIR (DIR made, its parent there):
    DIR holds the newest step's weights alone, which the server runs, and the run says so."""
    from rollpacker.backends.sglang.launch import launch_servers

    weights = tmp_path / "shared" / "weights"
    weights.parent.mkdir()
    out = tmp_path / "run"
    with launch_servers(str(tiny_model), num_servers=1, kind="rollpacker", timeout_s=90) as group:
        proc = run_train("--preset", "tiny_debug", "--model", tiny_model, "--out", out, "--steps", 2,
                         "--rollout", "sglang", "--sglang-urls", group.urls[0], "--weight-sync", f"disk:{weights}")
        with urllib.request.urlopen(group.urls[0] + "/get_model_info", timeout=30) as resp:
            assert json.loads(resp.read())["weight_version"] == "2"
    (kept,) = weights.iterdir()
    assert kept.name.startswith("rollpacker-weights-v2-") and (kept / "model.safetensors").is_file()
    assert f"--weight-sync disk:{weights}: each step's weights" in proc.stdout
    assert "only the newest copy is kept" in proc.stdout
    assert len(trained_keys(out)) == len(set(trained_keys(out))) == 4
