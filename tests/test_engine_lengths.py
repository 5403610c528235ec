"""The embedded engine never emits past `max_new_tokens`: random batches of requests on the real
engine (the tiny random Llama) with rows joining while others run, more requests than slots,
aborts, stop tokens on and off, and speculation on and off (siblings share a `group`, so drafts come
from each other's text and run up to a row's cap).  Every request gets exactly one result, with at
most `max_new_tokens` tokens, exactly that many when it ended by length (always, with stop tokens
off, unless aborted), and one log-prob per token."""

from __future__ import annotations

import pytest
from engine_batches import MAX_NEW, request_specs, run_waves, spec
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rollpacker.backends.embedded.engine import EmbeddedEngine
from rollpacker.backends.models import load_model, tiny_random_llama


@pytest.fixture(scope="module")
def model():
    return load_model(tiny_random_llama())[0]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=request_specs, capacity=st.integers(1, 4), spec_max_rows=st.sampled_from([0, 2, 4, 4]),
       spec_tokens=st.integers(1, 4), stops_on=st.booleans(), progress_every=st.integers(1, 4))
# the bug of issue 24: a row ended by its prefill token (max_new_tokens 1) also got this step's decode token
@example(specs=[spec(1), spec(3)], capacity=4, spec_max_rows=0, spec_tokens=4, stops_on=False, progress_every=1)
def test_no_result_is_longer_than_its_max_new_tokens(model, specs, capacity, spec_max_rows, spec_tokens,
                                                     stops_on, progress_every):
    vocab = model.config.vocab_size
    # a third of the vocabulary stops a request, so stops (at prefill too) are common on a random model
    stop_ids = frozenset(range(0, vocab, 3)) if stops_on else frozenset()
    engine = EmbeddedEngine(model, capacity=capacity, stop_token_ids=tuple(stop_ids), spec_max_rows=spec_max_rows,
                            spec_tokens=spec_tokens, progress_every=progress_every)
    try:
        results, progress = run_waves(engine, specs)
    finally:
        engine.close()
    assert set(results) == {f"r{i}" for i in range(len(specs))}
    for i, s in enumerate(specs):
        r = results[f"r{i}"]
        n, cap = len(r.token_ids), s["max_new"]
        assert len(r.logprobs) == n and all(lp <= 1e-6 for lp in r.logprobs), r
        assert n <= cap, f"{r.request_id}: {n} tokens for max_new_tokens={cap} ({r.finish_reason})"
        stops_at = [j for j, t in enumerate(r.token_ids) if t in stop_ids]
        if r.finish_reason == "length":
            assert n == cap and not stops_at, r
        elif r.finish_reason == "stop":
            assert stops_on and stops_at == [n - 1], r
        else:
            assert r.finish_reason == "abort" and s["abort"] and n < cap and not stops_at, r
    for p in progress:
        assert p.num_tokens <= specs[int(p.request_id[1:])]["max_new"], p


def test_speculation_stops_at_each_rows_cap_and_keeps_the_greedy_tokens(model):
    """One slot, so siblings run one after another: each drafts from the first one's greedy
    response and accepts up to its own cap, never past it, emitting exactly the first's prefix."""
    specs = [spec(m, group=1) for m in (MAX_NEW, 1, 2, 3, 5, 8, MAX_NEW)]
    with EmbeddedEngine(model, capacity=1, stop_token_ids=(), spec_max_rows=1, spec_tokens=4) as engine:
        results, _ = run_waves(engine, specs)
        stats = engine.speculation_stats
    assert stats.num_accepted >= 5, stats  # drafts really ran (into the caps)
    first = results["r0"].token_ids
    for i, s in enumerate(specs):
        r = results[f"r{i}"]
        assert r.finish_reason == "length" and r.token_ids == first[: s["max_new"]], r
        assert len(r.logprobs) == s["max_new"]


def test_a_one_token_request_beside_a_running_one_gets_one_token_and_one_result(model):
    """Issue 24's report (benchmarks/engine_throughput.py --quick, request e3), on its own."""
    specs = [spec(m, greedy=False) for m in (1, 5, 1)]
    with EmbeddedEngine(model, capacity=2, stop_token_ids=()) as engine:
        results, _ = run_waves(engine, specs)
    assert {rid: (len(r.token_ids), r.finish_reason) for rid, r in results.items()} == {
        "r0": (1, "length"), "r1": (5, "length"), "r2": (1, "length")}
