"""Defaults and settings that the reference trainer's live path wires, checked on a real Session (the
tiny model, the default TorchTitan trainer, the real engine): a unit test that passes a field by hand
does not show that the live path sets it."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    from rollpacker.backends.models import tiny_random_llama
    from rollpacker.train.config import parse
    from rollpacker.train.outputs import RunDir
    from rollpacker.train.session import Session

    config = parse(["--preset", "tiny_debug", "--tasks", "chain_sum", "--dataset-size", "16", "--model",
                    str(tiny_random_llama()), "--out", str(tmp_path_factory.mktemp("wiring") / "run")])
    config.validate()
    built = Session(config, RunDir(config.out))
    yield built
    built.close()


@pytest.mark.timeout(300)
def test_the_trainer_runs_the_head_at_response_positions_only_by_default(session):
    assert session.config.trainer == "titan"
    assert session.trainer.config.response_logits_only is True  # 1.26x (TorchTitan) on the CPU, docs/reference-trainer.md


@pytest.mark.timeout(300)
def test_the_scheduler_batches_by_the_memory_plan_s_micro_batch(session):
    assert session.memory_plan.micro_batch_tokens > 0
    assert session.scheduler.batcher.config.token_budget == session.memory_plan.micro_batch_tokens
    assert session.config.micro_batch_tokens == session.memory_plan.micro_batch_tokens  # saved with the run


@pytest.mark.timeout(300)
def test_the_scheduler_batches_by_a_pick_below_the_first_size(tmp_path, monkeypatch):
    """A device where the first size does not fit (as on a GPU where 8192 does not): the plan picks a
    smaller one, and the Scheduler is built with that pick, not with the first size (the default a
    Scheduler built before the plan would get).  On the CPU both are 256, so the sizes are set here."""
    from rollpacker.backends.models import tiny_random_llama
    from rollpacker.train import memory_plan
    from rollpacker.train.config import parse
    from rollpacker.train.outputs import RunDir
    from rollpacker.train.session import Session

    real_fitted = memory_plan.fitted
    monkeypatch.setitem(memory_plan.MICRO_BATCH_TOKENS, "cpu", (1024, 512))
    monkeypatch.setattr(memory_plan, "fitted", lambda plans: real_fitted(p for p in plans if p.micro_batch_tokens < 1024))
    config = parse(["--preset", "tiny_debug", "--tasks", "chain_sum", "--dataset-size", "16", "--model",
                    str(tiny_random_llama()), "--trainer", "torch", "--out", str(tmp_path / "run")])
    config.validate()
    session = Session(config, RunDir(config.out))
    try:
        assert session.memory_plan.micro_batch_tokens == 512
        assert session.scheduler.batcher.config.token_budget == 512
    finally:
        session.close()
