"""The TorchTitan trainer under torchrun on CPU/gloo: FSDP2, TP, FSDP2+TP against a transformers
reference (and the plain PyTorch trainer with FSDP2); streamed accumulation; training progress; export; checkpoint save -> kill -> resume.

Each case runs tests/titan_dist_check.py twice (train, then resume in a fresh process group) and
asserts on the JSON it writes.  The 2-rank cases share their launches (`two_rank_results`: one
torchrun trains them in turn, each with its own trainer and checkpoint, then one fresh torchrun
resumes each); FSDP2+TP (4 ranks) has its own.  Figures are printed (run with -s to see them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from titan_tiny import make_tiny_checkpoint  # noqa: E402

SCRIPT = Path(__file__).with_name("titan_dist_check.py")
REPO = SCRIPT.parent.parent
GRAD_TOL = 1e-5  # float32, absolute (gradients here reach ~6)

CASES = {
    # id: (nproc, dp_shard, tp, family, tied, trainer)
    "fsdp2": (2, 2, 1, "llama", True, "titan"),
    "tp2": (2, 1, 2, "qwen3", False, "titan"),
    "fsdp2+tp2": (4, 2, 2, "llama", False, "titan"),
    "torch-fsdp2": (2, 2, 1, "llama", True, "torch"),  # TorchTrainer: fully_shard on the HF model
}
SHARED_ORDER = ("torch-fsdp2", "fsdp2", "tp2")
"""The 2-rank cases, in the order one launch runs them: the plain PyTorch trainer first, before
TorchTitan's trainer has patched anything in the process."""


def _skip_without(trainer: str) -> None:
    if trainer == "titan":
        pytest.importorskip("torchtitan")


def _launch(nproc: int, args: list[str], timeout: float) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           "--standalone", str(SCRIPT), *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")


def _titan_imports() -> bool:
    try:
        import torchtitan  # noqa: F401
    except ImportError:
        return False
    return True


def _case_flags(case: str, root: Path) -> dict:
    _, dp_shard, tp, family, tied, trainer = CASES[case]
    return {"model_dir": str(make_tiny_checkpoint(root / "model", family=family, tied=tied)), "dp_shard": dp_shard,
            "tp": tp, "ckpt": str(root / "ckpt"), "trainer": trainer}


def _run_cases(nproc: int, cases: dict[str, Path], timeout: float) -> dict[str, tuple[dict, dict]]:
    """Train `cases` (id -> its directory) in one torchrun, then resume them in a fresh one:
    id -> (train JSON, resume JSON)."""
    flags = {case: _case_flags(case, root) for case, root in cases.items()}
    for phase in ("train", "resume"):
        listed = [{**flags[case], "out": str(root / f"{phase}.json")} for case, root in cases.items()]
        spec = next(iter(cases.values())).parent / f"{'+'.join(cases)}-{phase}.json"
        spec.write_text(json.dumps(listed))
        _launch(nproc, ["--cases", str(spec), "--phase", phase], timeout=timeout)
    return {case: (json.loads((root / "train.json").read_text()), json.loads((root / "resume.json").read_text()))
            for case, root in cases.items()}


@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory) -> dict[str, tuple[dict, dict]]:
    """The 2-rank cases (those whose trainer imports), trained in one torchrun and resumed in another."""
    tmp = tmp_path_factory.mktemp("two-ranks")
    cases = [c for c in SHARED_ORDER if CASES[c][5] != "titan" or _titan_imports()]
    return _run_cases(2, {case: tmp / case for case in cases}, timeout=240)


@pytest.fixture
def shared(request, case: str) -> tuple[dict, dict] | None:
    """A 2-rank case's results from `two_rank_results` (in the test's setup: the shared launches are
    bounded by their own timeouts, not by whichever test asks first); None for the others."""
    if case not in SHARED_ORDER or (CASES[case][5] == "titan" and not _titan_imports()):
        return None
    return request.getfixturevalue("two_rank_results")[case]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("case", list(CASES))
def test_titan_distributed(case: str, tmp_path: Path, shared) -> None:
    nproc, dp_shard, _, family, tied, trainer = CASES[case]
    _skip_without(trainer)
    r, resumed = shared or _run_cases(nproc, {case: tmp_path / case}, timeout=90)[case]
    print(f"\n[{case}] {family} tied={tied}: loss diff {r['loss_abs_diff']:.2e}, "
          f"grad diff {r['grad_max_abs_diff']:.2e} (max |g| {r['grad_max_abs']:.2f}), "
          f"streamed grad diff {r['stream_grad_max_abs_diff']:.2e}, "
          f"export logits diff {r['export_logits_max_abs_diff']:.2e}, losses {[round(x, 3) for x in r['losses']]}, "
          f"next losses {r['next_losses']} vs resumed {resumed['next_losses']}")

    assert r["world_size"] == nproc and r["dp_shard"] == dp_shard
    # Loss and gradients match the single-process transformers reference.
    assert r["loss_abs_diff"] <= 1e-5 * max(1.0, abs(r["ref_loss"]))
    assert r["grad_max_abs_diff"] <= GRAD_TOL
    assert 0.0 < r["clip_fraction"] < 1.0  # the batch exercises both clipped and unclipped tokens
    # Streamed micro-batches sum to the full-batch gradient.
    assert r["stream_grad_max_abs_diff"] <= GRAD_TOL
    assert r["stream_loss_abs_diff"] <= 1e-5 * max(1.0, abs(r["loss"]))
    # A few optimizer steps lower the loss on the fixed batch.
    losses = r["losses"]
    # (non-increasing: once every token's ratio is clipped the loss sits at its floor)
    assert losses[1] < losses[0] and losses[-1] < losses[0], losses
    assert all(b <= a + 1e-5 for a, b in zip(losses, losses[1:])), losses
    # Export -> transformers gives the trained model's logits; the (tied) embedding was updated.
    assert r["export_missing"] == [] and r["export_unexpected"] == []
    assert r["embed_update_max_abs"] > 0.0
    assert r["export_logits_max_abs_diff"] <= 1e-5
    # Save -> kill -> load in a fresh process resumes with identical next-step losses.
    assert resumed["step_at_load"] == r["step_at_save"]
    assert resumed["next_losses"] == pytest.approx(r["next_losses"], abs=1e-6, rel=0)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("trainer", ["titan", "torch"])
def test_titan_single_process_world_of_one(tmp_path: Path, trainer: str) -> None:
    """Without torchrun the trainer is a world of one; same checks, plain python."""
    _skip_without(trainer)
    model_dir = make_tiny_checkpoint(tmp_path / "model", family="qwen3", tied=True)
    out = tmp_path / "r.json"
    cmd = [sys.executable, str(SCRIPT), "--model-dir", str(model_dir), "--ckpt", str(tmp_path / "ckpt"), "--out", str(out),
           "--trainer", trainer]
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(out.read_text())
    assert r["world_size"] == 1
    assert r["grad_max_abs_diff"] <= GRAD_TOL and r["stream_grad_max_abs_diff"] <= GRAD_TOL
    assert r["export_logits_max_abs_diff"] <= 1e-5
    assert r["losses"][-1] < r["losses"][0]
