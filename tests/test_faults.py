"""The trainer's fault suite: what a user hits at the edges, each case ending in one clear line or a
recovered run (no step logged twice, no prompt lost or trained twice).  Real processes throughout:
the reference trainer on the tiny random Llama (`rollpacker serve`'s faults: test_serve_faults.py).
docs/faults.md's table lists these cases and the existing tests that cover the others (kill
mid-rollout, kill during the state save, hung / raising / NaN scorer, dead rollout server)."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rollpacker.train.outputs import RunDir, interrupt_after
from test_reference_train import ROOT, TRAIN, records, run_train, tiny_model  # noqa: F401 - fixture

STATE_FILE_LIMIT = 30 << 20
"""RLIMIT_FSIZE of the "full disk" case: the tiny model's trainer state (~50 MB) cannot be written,
everything else (metrics, events, scheduler JSON) can."""


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def assert_one_clear_line(proc, returncode: int, *needles: str) -> str:
    assert proc.returncode == returncode, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    (line,) = error_lines(proc.stderr)
    for needle in needles:
        assert needle in line, line
    return line


def trained_keys(run_dir: Path) -> list:
    return [k for r in records(run_dir) for k in r["trained"]]


# -- flags: every one checked in validate(), before any model loads ------------------------------

@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "args,flag",
    [
        (["--temperature", "-1"], "--temperature"),
        (["--lr", "-1"], "--lr"),
        (["--lr", "nan"], "--lr"),
        (["--top-p", "2"], "--top-p"),
        (["--kl-coef", "-1"], "--kl-coef"),
        (["--samples", "1"], "--samples must be >= 2, got 1 (advantages compare"),  # trained at loss 0, silently
        (["--max-tokens", "100000"], "--max-tokens 100000"),
        (["--reward-deadline-s", "0"], "--reward-deadline-s"),
        (["--rollout", "sglang", "--sglang-urls", "notaurl"], "--sglang-urls"),
        (["--tp", "2"], "--nproc"),
        (["--out", "/proc/nope"], "--out /proc/nope"),
    ],
)
def test_bad_flag_is_one_line_naming_it_before_any_model_loads(tiny_model, tmp_path, args, flag):
    start = time.monotonic()
    proc = run_train("--preset", "tiny_debug", "--model", tiny_model, "--out", tmp_path / "run", *args,
                     check=False, timeout=100)
    assert_one_clear_line(proc, 2, flag)
    assert "Loading weights" not in proc.stderr and time.monotonic() - start < 60


# -- run directories and --resume -----------------------------------------------------------------

# `finished_run` (tests/conftest.py): a finished 1-step run, shared with test_resume_faults.py.

@pytest.mark.timeout(300)
def test_a_new_run_into_a_used_directory_refuses(tiny_model, finished_run):
    before = (finished_run / "metrics.jsonl").read_text()
    proc = run_train("--preset", "tiny_debug", "--model", tiny_model, "--out", finished_run, "--steps", 1,
                     check=False, timeout=100)
    assert_one_clear_line(proc, 2, f"--resume {finished_run}", "fresh --out")
    assert (finished_run / "metrics.jsonl").read_text() == before


@pytest.mark.timeout(120)
def test_compare_into_a_used_directory_refuses(tiny_model, finished_run):
    """--compare writes one run per policy under --out: a used one refuses too."""
    proc = run_train("--preset", "tiny_debug", "--model", tiny_model, "--out", finished_run.parent,
                     "--compare", "sync,tail", check=False, timeout=100)
    assert_one_clear_line(proc, 2, f"--out {finished_run} already holds a run")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("args,flag", [(["--policy", "sorted"], "--policy sorted"), (["--lr", "0.1"], "--lr 0.1")])
def test_resume_refuses_a_flag_that_would_change_the_run(finished_run, args, flag):
    proc = run_train("--resume", finished_run, "--steps", 2, *args, check=False, timeout=100)
    assert_one_clear_line(proc, 2, flag, "only --steps may change")
    assert [r["step"] for r in records(finished_run)] == [0]


@pytest.mark.timeout(300)
def test_resume_with_no_steps_left_says_so_without_loading(finished_run):
    proc = run_train("--resume", finished_run, "--steps", 1, timeout=100)
    assert "nothing to do" in proc.stdout and "--steps 2" in proc.stdout
    assert "Loading weights" not in proc.stderr and [r["step"] for r in records(finished_run)] == [0]


# -- Ctrl-C and a full disk: one line, then the run resumes with nothing lost or repeated -----------

@pytest.mark.timeout(400)
def test_ctrl_c_is_one_line_and_exit_130_then_resume_trains_every_prompt_once(tiny_model, tmp_path):
    out = tmp_path / "run"
    args = ["--preset", "tiny_debug", "--model", tiny_model, "--out", out, "--steps", 4, "--max-tokens", 48]
    proc = start_train(*args)
    wait_for_saved_step(out, 1, proc)  # step 0 trained and saved
    time.sleep(0.7)  # inside the next step (on a loaded machine maybe still in its save: both must hold)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole process group
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr[-3000:]
    step = RunDir(out).saved_step()  # the line names the step the saved state resumes from
    assert step is not None and step >= 1 and len(records(out)) in (step, step + 1)
    assert stderr.strip().splitlines()[-1] == f"interrupted at step {step}; --resume {out} continues"
    run_train("--resume", out, timeout=300)
    assert [r["step"] for r in records(out)] == [0, 1, 2, 3]
    assert len(trained_keys(out)) == len(set(trained_keys(out))) == 4 * 2, "a prompt was lost or trained twice"


@pytest.mark.timeout(400)
def test_sigterm_is_one_line_and_exit_143_then_resume_trains_every_prompt_once(tiny_model, tmp_path):
    """What a job scheduler or `kill` sends: the same way out as Ctrl-C, with the conventional 128 + 15."""
    out = tmp_path / "run"
    args = ["--preset", "tiny_debug", "--model", tiny_model, "--out", out, "--steps", 4, "--max-tokens", 48]
    proc = start_train(*args)
    wait_for_saved_step(out, 1, proc)
    time.sleep(0.7)  # inside the next step (or still in its save: both must hold)
    os.killpg(proc.pid, signal.SIGTERM)  # the whole group, as a scheduler does; the reward workers ignore it
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143 and "Traceback" not in stderr, stderr[-3000:]
    step = RunDir(out).saved_step()
    assert step is not None and step >= 1 and len(records(out)) in (step, step + 1)
    assert stderr.strip().splitlines()[-1] == f"terminated (SIGTERM) at step {step}; --resume {out} continues"
    run_train("--resume", out, timeout=300)
    assert [r["step"] for r in records(out)] == [0, 1, 2, 3]
    assert len(trained_keys(out)) == len(set(trained_keys(out))) == 4 * 2, "a prompt was lost or trained twice"


class _Terminated(KeyboardInterrupt):
    pass


def _raise_terminated(signum, frame):
    raise _Terminated


@pytest.mark.parametrize("sig,raised", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, _Terminated)])
def test_ctrl_c_or_sigterm_during_the_state_save_waits_for_it_then_stops(sig, raised):
    """torch's writers turn an exception raised inside a write into a failed save: the signal waits
    for the end of the save, then its handler (the trainer's, as reference/train.py installs them whatever the
    process inherited) runs."""
    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, _raise_terminated),
                signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler)}
    finished = []
    try:
        with pytest.raises(raised):
            with interrupt_after():
                os.kill(os.getpid(), sig)
                time.sleep(0.2)  # a handler would have run by now
                finished.append(True)
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    assert finished == [True]


def start_train(*args) -> subprocess.Popen:
    """The trainer in a session of its own, started with SIGINT ignored, as a script that runs it in the
    background (or a CI runner) hands it: its Ctrl-C must work all the same, whatever started the tests."""
    return subprocess.Popen([sys.executable, str(TRAIN), *map(str, args)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))


def wait_for_saved_step(out: Path, step: int, proc: subprocess.Popen, timeout_s: float = 250) -> None:
    """Until `out` holds the state of `step` finished steps (generous: the machine may be loaded)."""
    deadline = time.monotonic() + timeout_s
    while (RunDir(out).saved_step() or 0) < step:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"no state of step {step} in {out} after {timeout_s} s"
        time.sleep(0.1)


# -- one trainer per run directory ----------------------------------------------------------------

@pytest.mark.timeout(500)
def test_a_second_trainer_on_a_live_run_directory_is_refused_naming_the_pid(tiny_model, tmp_path):
    """A --compare run holds its directory and each policy's; a new run, a --resume or another
    --compare there is one line naming its PID, and nothing of the live run changes.  A kill -9
    leaves no stale lock behind."""
    out = tmp_path / "compare"
    live = start_train("--preset", "tiny_debug", "--model", tiny_model, "--out", out, "--compare", "sync,tail",
                       "--steps", 200)
    try:
        wait_for_saved_step(out / "sync", 1, live)
        attempts = {
            "new run": ["--preset", "tiny_debug", "--model", tiny_model, "--out", out, "--steps", 1],
            "resume": ["--resume", out / "sync", "--steps", 300],
            "compare": ["--preset", "tiny_debug", "--model", tiny_model, "--out", out, "--compare", "sync,tail"],
        }
        for name, args in attempts.items():
            proc = run_train(*args, check=False, timeout=100)
            line = assert_one_clear_line(proc, 2, f"process {live.pid} holds", "in use")
            assert "Loading weights" not in proc.stderr, (name, line)
        assert live.poll() is None, "the live run was disturbed"
    finally:
        os.killpg(live.pid, signal.SIGKILL)
        live.communicate(timeout=60)
    steps = [r["step"] for r in records(out / "sync")]
    assert steps == list(range(len(steps))), "a step was logged twice"
    done = RunDir(out / "sync").saved_step()
    proc = run_train("--resume", out / "sync", "--steps", done, timeout=100)  # the lock died with the process
    assert "nothing to do" in proc.stdout, proc.stderr[-3000:]


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (STATE_FILE_LIMIT, STATE_FILE_LIMIT))


@pytest.mark.timeout(400)
def test_a_failed_save_is_one_line_keeps_the_previous_state_and_resumes(full_disk_then_resumed):
    """A copy of `finished_run` resumed to 2 steps under a 30 MB file-size limit, then resumed again
    (the run of tests/conftest.py's `full_disk_then_resumed`, whose TensorBoard events
    test_resume_faults.py checks)."""
    seen = full_disk_then_resumed
    out, proc = seen["out"], seen["failed"]
    assert_one_clear_line(proc, 2, "saving the state of step 2", f"the previous state in {out / 'state'} is intact")
    assert any(line.startswith("step   1 ") for line in proc.stdout.splitlines()), proc.stdout  # printed before the save
    assert seen["scheduler_after_failure"]["step"] == 1
    assert not seen["state_tmp_after_failure"]
    assert seen["resumed"].returncode == 0
    assert [r["step"] for r in records(out)] == [0, 1]
    assert len(trained_keys(out)) == len(set(trained_keys(out))) == 2 * 2


# -- a broken reward function: counted per kind, named once, and a step with no reward stops the run --

BROKEN_REWARDS = textwrap.dedent('''
    import os, sys

    def exits(data_source, solution_str, ground_truth, extra_info=None):
        sys.exit(3)

    def os_exits(data_source, solution_str, ground_truth, extra_info=None):
        os._exit(3)

    def returns_none(data_source, solution_str, ground_truth, extra_info=None):
        return None
''')


@pytest.mark.timeout(400)
@pytest.mark.parametrize("function,kind,needle", [
    ("exits", "raised", "SystemExit: 3 (at {file}:5 in exits)"),
    ("os_exits", "worker_died", "exited with code 3"),
    ("returns_none", "bad_value", "returned None"),
])
def test_a_reward_function_that_exits_or_returns_none_stops_the_run_naming_it(tiny_model, tmp_path, request,
                                                                               function, kind, needle):
    if function == "returns_none":  # the run test_resume_faults.py resumes (tests/conftest.py), not trained twice
        run = request.getfixturevalue("all_rewards_none_run")
        out, proc, rewards = run["out"], run["proc"], run["rewards"]
    else:
        rewards = tmp_path / "broken.py"
        rewards.write_text(BROKEN_REWARDS)
        out = tmp_path / "run"
        proc = run_train("--preset", "tiny_debug", "--model", tiny_model, "--out", out, "--steps", 1,
                         "--reward", f"{rewards}:{function}", check=False, timeout=200)
    needle = needle.format(file=rewards)
    line = assert_one_clear_line(proc, 2, "step 0: every reward failed", needle, f"--resume {out}",
                                 "--allow-failed-rewards")
    (warning,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("warning: step 0: the reward function")]
    assert f"({kind}): " in warning and needle in warning, warning
    (record,) = records(out)  # the step is logged with its failures per kind, but not saved
    failures = record["reward_failures_by_kind"]
    assert failures[kind] == record["reward_failures"] > 0 and sum(failures.values()) == failures[kind], record
    assert RunDir(out).saved_step() == 0, line
    if function != "os_exits":
        return
    proc = run_train("--resume", out, "--allow-failed-rewards", timeout=200)  # the step again, on reward 0
    assert "Traceback" not in proc.stderr and not error_lines(proc.stderr), proc.stderr[-3000:]
    assert [r["step"] for r in records(out)] == [0] and RunDir(out).saved_step() == 1
    assert f"reward 0.000 ({records(out)[0]['reward_failures']} failed)" in proc.stdout


def test_hf_checkpoint_files_are_readable_by_others(finished_run):
    weights = finished_run / "checkpoints" / "step_1" / "model.safetensors"
    assert weights.stat().st_mode & 0o044 == 0o044


# -- the only rollout server dies mid-run ---------------------------------------------------------

@pytest.mark.timeout(500)
def test_the_only_server_dying_mid_run_is_one_line_naming_it_and_the_resume(tiny_model, tmp_path):
    """kill -9 of the one `rollpacker serve` after a step was saved: one line naming the server and
    `--resume DIR` (as the Ctrl-C line does), exit 2, no traceback."""
    from sglang_helpers import launch

    out = tmp_path / "run"
    with launch("rollpacker", str(tiny_model), 1) as group:
        (server,) = group.servers
        proc = start_train("--preset", "tiny_debug", "--model", tiny_model, "--trainer", "torch", "--out", out,
                           "--steps", 50, "--rollout", "sglang", "--sglang-urls", server.url)
        wait_for_saved_step(out, 1, proc, timeout_s=300)
        server.kill()
        _, stderr = proc.communicate(timeout=200)
    proc.stderr = stderr
    step = RunDir(out).saved_step()
    assert_one_clear_line(proc, 2, server.url, f"--resume {out} continues from step {step}")
