import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.hookimpl(trylast=True)  # after pytest's own ordering by fixture
def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` are skipped when torch sees no CUDA device.  Tests marked
    `kills_a_shared_server` run last, in their order: the modules that share the servers
    (`shared_servers`) then need no server started again."""
    import torch

    items.sort(key=lambda item: "kills_a_shared_server" in item.keywords)  # stable: the rest keep their order
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shared_servers():
    """The server pairs that the SGLang backend modules share (`sglang_helpers.SharedServers`),
    stopped when the session ends."""
    from sglang_helpers import SharedServers

    shared = SharedServers()
    try:
        yield shared
    finally:
        shared.close()


# -- runs of the reference trainer that test_faults.py and test_resume_faults.py both read ----------
# (session-scoped here, not module-scoped in either module: each would otherwise train its own)

@pytest.fixture(scope="session")
def finished_run(tmp_path_factory) -> Path:
    """A finished 1-step run of the tiny random Llama, in a directory named after its policy; no test
    changes it (tests that change it work on a copy)."""
    from test_reference_train import run_train

    from rollpacker.backends.models import tiny_random_llama

    out = tmp_path_factory.mktemp("finished") / "tail"
    run_train("--preset", "tiny_debug", "--model", tiny_random_llama(), "--out", out, "--steps", 1)
    return out


@pytest.fixture(scope="session")
def full_disk_then_resumed(finished_run, tmp_path_factory) -> dict:
    """A copy of `finished_run` resumed to 2 steps with its files limited to 30 MB (the state of step 2
    cannot be written: a full disk), then resumed again without the limit.  What each stage left is
    recorded for the tests to assert on: test_faults.py (the failed save's line, the state it kept, the
    resume) and test_resume_faults.py (TensorBoard's events at each stage)."""
    import json
    import shutil
    import subprocess

    from test_faults import _limit_file_size
    from test_reference_train import ROOT, TRAIN, run_train
    from test_resume_faults import tensorboard_events

    out = tmp_path_factory.mktemp("full-disk") / "run"
    shutil.copytree(finished_run, out)
    seen: dict = {"out": out, "events_before": tensorboard_events(out)}
    seen["failed"] = subprocess.run([sys.executable, str(TRAIN), "--resume", str(out), "--steps", "2"], cwd=ROOT,
                                    capture_output=True, text=True, timeout=200, preexec_fn=_limit_file_size,
                                    check=False)
    seen["scheduler_after_failure"] = json.loads((out / "state" / "scheduler.json").read_text())
    seen["state_tmp_after_failure"] = (out / "state.tmp").exists()
    seen["events_after_failure"] = tensorboard_events(out)
    if seen["failed"].returncode == 2:  # else the tests name what went wrong from the failed call's output
        seen["resumed"] = run_train("--resume", out, "--steps", 2, timeout=300)
    return seen


@pytest.fixture(scope="session")
def all_rewards_none_run(tmp_path_factory) -> dict:
    """A 1-step run whose reward function returns None for every sample (BROKEN_REWARDS:returns_none):
    the call and the directory it leaves, which no test changes (a test that resumes it copies it)."""
    from test_faults import BROKEN_REWARDS
    from test_reference_train import run_train

    from rollpacker.backends.models import tiny_random_llama

    where = tmp_path_factory.mktemp("rewards-none")
    rewards = where / "broken.py"
    rewards.write_text(BROKEN_REWARDS)
    out = where / "run"
    proc = run_train("--preset", "tiny_debug", "--model", tiny_random_llama(), "--out", out, "--steps", 1,
                     "--reward", f"{rewards}:returns_none", check=False, timeout=200)
    return {"out": out, "proc": proc, "rewards": rewards}
