"""`rollpacker.backends.calibration` on the real embedded engine (tiny random Llama): the abort latency by
requests caught, the measurement behind `EngineProfile.abort_s` and `abort_request_s`."""

from __future__ import annotations

import pytest

from rollpacker.backends.calibration import Calibration
from rollpacker.backends.embedded.engine import EmbeddedEngine
from rollpacker.backends.models import load_model, tiny_random_llama
from rollpacker.core.protocols import GenerationResult
from rollpacker.sim.engine_profile import fit_abort


@pytest.fixture(scope="module")
def engine():
    model, _ = load_model(tiny_random_llama())
    with EmbeddedEngine(model, capacity=8, stop_token_ids=(), kv_tokens_per_row=1100) as engine:
        yield engine, model.config.vocab_size


@pytest.mark.timeout(300)
def test_each_count_is_one_abort_call_whose_requests_come_back_aborted(engine):
    engine, vocab = engine
    seen = []
    poll = engine.poll

    def watched(timeout=None):
        out = poll(timeout)
        seen.extend(o for o in out if isinstance(o, GenerationResult))
        return out

    engine.poll = watched
    try:
        points = Calibration(engine, vocab_size=vocab).aborts(rows=(1, 4), prompt=8, new=1024, after_s=0.05, repeats=1)
    finally:
        del engine.poll
    assert [rows for rows, _ in points] == [1, 4] and all(0 < seconds < 30 for _, seconds in points)
    assert len(seen) == 5 and all(r.finish_reason == "abort" and len(r.token_ids) < 1024 for r in seen)
    fitted = fit_abort(points)
    assert fitted["abort_s"] >= 0 and fitted["abort_request_s"] >= 0 and fitted["aborts"] == points


@pytest.mark.timeout(300)
def test_requests_that_finish_before_their_abort_are_an_error_not_a_latency(engine):
    engine, vocab = engine
    with pytest.raises(RuntimeError, match="before their abort"):
        Calibration(engine, vocab_size=vocab).abort_s(rows=2, prompt=8, new=2, after_s=1.0, repeats=1)


@pytest.mark.timeout(300)
def test_the_trainers_optimizer_step_is_timed_warm_and_after_a_backward():
    """The first optimizer step allocates the optimizer's state (several times a live step on the tiny
    model): the figure is the median of the steps after it, each with gradients to apply."""
    import statistics
    import time

    from rollpacker.backends.calibration import time_trainer
    from rollpacker.train.config import parse
    from rollpacker.train.session import build_trainer

    config = parse(["--model", str(tiny_random_llama()), "--trainer", "torch", "--max-tokens", "16", "--device", "cpu"])
    trainer = build_trainer(config, tiny_random_llama())
    steps = []  # (seconds, had gradients, optimizer state before)
    step = trainer.optimizer_step

    def watched(normalizer):
        grads = any(p.grad is not None for p in trainer.model.parameters())
        state = len(trainer.optimizer.state)
        start = time.monotonic()
        out = step(normalizer)
        steps.append((time.monotonic() - start, grads, state))
        return out

    trainer.optimizer_step = watched
    timings = time_trainer(trainer, vocab_size=trainer.vocab_size, rows=(2,), prompts=(8,), responses=(4,), repeats=3)
    assert len(timings) == 2 and timings[-1][:3] == (0, 0, 0)
    assert len(steps) == 4 and steps[0][2] == 0, "one untimed step that allocates the state, then 3 timed"
    assert all(grads and state > 0 for _, grads, state in steps[1:]), "each timed step is warm, with gradients"
    assert timings[-1][3] == pytest.approx(statistics.median(s for s, *_ in steps[1:]), abs=2e-3)


def test_the_profile_says_the_embedded_engine_attends_the_columns_its_decode_reads(engine):
    """The calibrated profile's `attention_columns` is the engine's own: a decode of rows of unequal context reads
    the longest row's, rounded up to the runner's column multiple; SGLang's paged attention reads each row's."""
    import argparse
    import sys
    import time
    from pathlib import Path

    from rollpacker.core.protocols import GenerationRequest

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from sim_vs_real_calibrate import attention_columns

    engine, _ = engine
    runner = engine._batch._runner
    columns = attention_columns(argparse.Namespace(engine="embedded", device=str(runner.device)))
    assert columns == runner.col_multiple > 1
    assert attention_columns(argparse.Namespace(engine="sglang", device="cpu")) == 0
    before = set(runner.decode_keys)
    engine.submit([GenerationRequest(f"cols{n}", tuple(range(10, 10 + n)), 2, ignore_eos=True) for n in (3, 40)])
    done, deadline = set(), time.monotonic() + 60
    while len(done) < 2 and time.monotonic() < deadline:
        done |= {out.request_id for out in engine.poll(0.05) if isinstance(out, GenerationResult)}
    assert len(done) == 2
    read = {cols for rows, _, cols in runner.decode_keys - before if rows == 2}
    assert read == {-(-41 // columns) * columns}, runner.decode_keys - before
