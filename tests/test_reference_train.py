"""reference/train.py end to end on a tiny random Llama (real engine, real reward workers, real
TorchTitan or plain PyTorch trainer): a 2-step run, a kill mid-run and --resume, bad input, and the
engine holding the trainer's weights after a sync."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "reference" / "train.py"


@pytest.fixture(scope="module")
def tiny_model():
    from rollpacker.backends.models import tiny_random_llama

    return tiny_random_llama()


def run_train(*args, timeout=240, check=True):
    proc = subprocess.run([sys.executable, str(TRAIN), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f"train.py failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


TRAINERS = ("titan", "torch")  # --trainer: TorchTitan, or plain PyTorch on the HF model
TRAINER_CLASS = {"titan": "TitanTrainer", "torch": "TorchTrainer"}


def trainer_state(run_dir: Path) -> dict:
    return json.loads((run_dir / "state" / "trainer" / "rollpacker_trainer.json").read_text())


@pytest.mark.timeout(300)
@pytest.mark.parametrize("trainer", TRAINERS)
def test_two_step_run_writes_every_output(tiny_model, tmp_path, trainer):
    out = tmp_path / "run"
    proc = run_train("--preset", "tiny_debug", "--model", tiny_model, "--out", out, "--steps", 2, "--trainer", trainer)
    assert trainer_state(out)["trainer"] == TRAINER_CLASS[trainer] and trainer_state(out)["step"] == 2
    rs = records(out)
    assert [r["step"] for r in rs] == [0, 1]
    for r in rs:
        assert r["trained_prompts"] == 2 and r["on_policy_fraction"] == 1.0 and r["duplicate_prompts"] == 0
        assert r["step_s"] >= r["rollout_s"] > 0 and 0.0 <= r["bubble_ratio"] <= 1.0
        for key in ("reward_s", "train_s", "train_overlapped_s", "train_exposed_s", "generated_tokens",
                    "wasted_tokens", "mean_reward"):
            assert key in r
        busy = sum(b - a for a, b, _ in r["train_spans"])  # (rounded to 0.1 ms)
        assert r["train_s"] == pytest.approx(busy, abs=1e-3) and r["train_overlapped_s"] <= r["train_s"]
        assert min(r[k] for k in ("reward_s", "train_overlapped_s", "train_exposed_s", "sync_s")) >= 0.0
        assert r["step_s"] == pytest.approx(r["rollout_s"] + r["reward_s"] + r["train_exposed_s"] + r["sync_s"])
        assert len(r["train_spans"]) >= 2 and r["train_spans"][-1][2] == "optimizer step"
        # a forward or more a micro-batch, each padded past the kept tokens by the prompts at least
        assert r["train_forwards"] >= len(r["train_spans"]) - 1 and r["train_padded_tokens"] > r["kept_tokens"]
    trained = [k for r in rs for k in r["trained"]]
    assert len(trained) == len(set(trained)) == 4
    assert "step   1" in proc.stdout and "outputs in" in proc.stdout
    assert_setup_phases_come_before_the_first_step(proc.stdout, trainer)
    # --micro-batch-tokens unset: the plan's pick on the CPU, printed and saved with the run for a resume
    assert "micro-batches of 256 response tokens" in proc.stdout
    assert json.loads((out / "state" / "config.json").read_text())["micro_batch_tokens"] == 256
    for name in ("timeline.png", "summary.png"):
        assert (out / name).stat().st_size > 1000
    assert any((out / "tensorboard").iterdir())
    # the HF checkpoint loads in transformers; it moved iff some group had a reward signal (a group
    # whose rewards all agree has zero GRPO advantage, so a random model's all-zero rewards train nothing)
    import torch
    from transformers import AutoModelForCausalLM

    trained_model = AutoModelForCausalLM.from_pretrained(out / "checkpoints" / "step_2")
    initial = AutoModelForCausalLM.from_pretrained(tiny_model)
    diffs = [(a - b).abs().max().item() for a, b in zip(trained_model.parameters(), initial.parameters())]
    assert all(torch.isfinite(p).all() for p in trained_model.parameters())
    had_signal = any(r["nonzero_variance_groups"] > 0 for r in rs)
    assert (max(diffs) > 0) == had_signal


SETUP_PHASES = ("reading the prompts", "loading the model", "building the trainer ({trainer})",
                "starting the rollout engine (embedded)", "starting 1 reward worker", "saving the initial state",
                "policy tail on cpu")


def assert_setup_phases_come_before_the_first_step(stdout: str, trainer: str) -> None:
    """The minutes before a run's first step (loading, building, the first save) say what they do, a
    line per phase with the seconds since the run began, in order, before the first step's line."""
    lines = stdout.splitlines()
    first_step = next(i for i, line in enumerate(lines) if line.startswith("step   0 "))
    at = []
    for phase in SETUP_PHASES:
        (i,) = [i for i, line in enumerate(lines[:first_step]) if phase.format(trainer=trainer) in line]
        assert re.match(r"\[ *\d+\.\d s\] ", lines[i]), lines[i]
        at.append(i)
    assert at == sorted(at), lines[:first_step]
    seconds = [float(lines[i][1:].split(" s]")[0]) for i in at]
    assert seconds == sorted(seconds), seconds


@pytest.mark.timeout(400)
def test_kill_mid_run_then_resume_trains_every_prompt_once(tiny_model, tmp_path):
    out = tmp_path / "run"
    args = ["--preset", "tiny_debug", "--model", tiny_model, "--out", out, "--steps", 5, "--max-tokens", 48]
    proc = subprocess.Popen([sys.executable, str(TRAIN), *map(str, args)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.time() + 200
    while time.time() < deadline:  # kill once a step is logged, somewhere inside the next one
        if (out / "metrics.jsonl").exists() and len(records(out)) >= 1:
            time.sleep(0.7)
            break
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    done_before = len(records(out)) if (out / "metrics.jsonl").exists() else 0
    assert 1 <= done_before < 5, "the kill should land mid-run"
    resumed = run_train("--resume", out, timeout=300)
    assert "resumed" in resumed.stdout
    rs = records(out)
    assert [r["step"] for r in rs] == [0, 1, 2, 3, 4]
    trained = [k for r in rs for k in r["trained"]]
    assert len(trained) == len(set(trained)) == 5 * 2, "a prompt was lost or trained twice"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "args,message",
    [
        (["--model", "/nonexistent/model"], "/nonexistent/model"),
        (["--tasks", "no_such_task"], "unknown task 'no_such_task'"),
        (["--tasks", "chain_sum:x"], "--tasks 'chain_sum:x': a weight is a number > 0 (NAME or NAME:WEIGHT)"),
        (["--prompts", "0"], "--prompts must be >= 1"),
        (["--policy", "tail", "--tail.eta-prompts", "0.5"], "eta_prompts"),
        (["--rollout", "sglang"], "--sglang-urls"),
        (["--rollout", "sglang", "--sglang-urls", "http://10.9.9.9:30000"], "--weight-sync nccl"),
        (["--weight-sync", "disk"], "--weight-sync"),
        (["--compare", "tail"], "two or more policies"),
    ],
)
def test_bad_input_fails_fast_with_a_clear_message(tmp_path, args, message):
    proc = run_train("--preset", "tiny_debug", "--out", tmp_path / "run", *args, check=False, timeout=100)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in proc.stderr and "Traceback" not in proc.stderr


def trainer_and_logits(kind: str, model_dir):
    """A trainer of `kind` and a function giving its policy's logits."""
    if kind == "torch":
        from rollpacker.backends.trainer.pytorch import TorchTrainer, TorchTrainerConfig

        trainer = TorchTrainer(TorchTrainerConfig(model_dir=str(model_dir), lr=1e-2, max_grad_norm=None))
        return trainer, lambda ids: trainer.model.hf(ids).logits
    from rollpacker.backends.titan.trainer import TitanConfig, TitanTrainer

    trainer = TitanTrainer(TitanConfig(model_dir=str(model_dir), lr=1e-2, max_grad_norm=None))
    return trainer, trainer.model


@pytest.mark.timeout(180)
@pytest.mark.parametrize("trainer_kind", TRAINERS)
def test_engine_logits_match_the_trainer_after_a_weight_sync(tiny_model, trainer_kind):
    import torch

    from rollpacker.backends.embedded.engine import EmbeddedEngine
    from rollpacker.core.protocols import MicroBatch, TrainSample

    trainer, trainer_logits = trainer_and_logits(trainer_kind, tiny_model)
    engine = EmbeddedEngine(str(tiny_model), capacity=4)
    try:
        batch = MicroBatch((TrainSample((1, 2, 3, 4), (5, 6, 7), 1.0, 1.0), TrainSample((8, 9), (10, 11), -1.0, 1.0)))
        trainer.forward_backward(batch)
        trainer.optimizer_step(5.0)
        ids = torch.tensor([[1, 5, 9, 13, 17, 21]])
        with torch.no_grad():
            before = engine.model(ids).logits
        engine.pause()
        engine.update_weights(trainer.export_weights(), version=1)
        engine.resume()
        with torch.no_grad():
            after = engine.model(ids).logits
            policy_logits = trainer_logits(ids)
        assert (after - before).abs().max() > 1e-3, "the update did not change the engine"
        assert (after - policy_logits).abs().max().item() < 1e-4
    finally:
        engine.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("trainer", TRAINERS)
def test_nproc_2_trains_with_an_fsdp2_trainer_under_torchrun(tiny_model, tmp_path, trainer):
    """--nproc 2 re-launches under torchrun: rank 0 drives rollout and scoring, both ranks train."""
    out = tmp_path / "run"
    proc = run_train("--preset", "tiny_debug", "--model", tiny_model, "--out", out, "--steps", 1, "--nproc", 2,
                     "--trainer", trainer)
    rs = records(out)
    assert [r["step"] for r in rs] == [0] and rs[0]["trained_prompts"] == 2
    state = trainer_state(out)
    assert state["trainer"] == TRAINER_CLASS[trainer] and state["step"] == 1
    assert state.get("dp_shard", state.get("world_size")) == 2
    assert "outputs in" in proc.stdout


@pytest.mark.timeout(300)
@pytest.mark.parametrize("weight_sync", [None, "nccl"])
def test_rollout_sglang_trains_against_a_served_engine(tiny_model, tmp_path, weight_sync):
    """--rollout sglang: the same run with rollout on a `rollpacker serve` server (SGLang's API); the
    weights reach it from disk (default) or in buckets over the distributed path (gloo here)."""
    import urllib.request

    from rollpacker.backends.sglang.launch import launch_servers

    out = tmp_path / "run"
    sync = ["--weight-sync", weight_sync, "--weight-sync-bucket-mb", "1"] if weight_sync else []
    from test_colocate import server_calls

    with launch_servers(str(tiny_model), num_servers=1, kind="rollpacker", timeout_s=90,
                        extra_args=("--log-calls",)) as group:
        proc = run_train("--preset", "tiny_debug", "--model", tiny_model, "--out", out, "--steps", 2,
                         "--rollout", "sglang", "--sglang-urls", group.urls[0], *sync)
        with urllib.request.urlopen(group.urls[0] + "/get_model_info", timeout=30) as resp:
            assert json.loads(resp.read())["weight_version"] == "2"  # synced after each of the 2 steps
        paths = [path for path, _, _ in server_calls(group.servers[0].log_path.read_text())]
    # the servers may hold another run's weights: the trainer's initial ones go first, then step 0
    first_weights = min(paths.index(p) for p in ("/update_weights_from_disk", "/init_weights_update_group")
                        if p in paths)
    assert first_weights < paths.index("/generate")
    rs = records(out)
    assert [r["step"] for r in rs] == [0, 1]
    trained = [k for r in rs for k in r["trained"]]
    assert len(trained) == len(set(trained)) == 4
    if weight_sync == "nccl":  # the whole model (12.9 MB) in 1 MB buckets, every step
        assert all(r["weight_sync_buckets"] > 1 and r["weight_sync_mb"] > 12 for r in rs)
    else:
        assert not any("weight_sync_mb" in r for r in rs)
