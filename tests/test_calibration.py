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
