"""Both rollout engines check a request the same way (one shared validation): the same bad batches
are refused with the same error and message, before anything is queued, by the embedded engine
(a tiny real model) and by the SGLang client (a real loopback server)."""

from __future__ import annotations

import pytest
from sglang_helpers import fake_sglang, request
from test_backend_errors import FAST, first_results, silent_stream

from rollpacker.backends.errors import BackendMisuse
from rollpacker.backends.requests import UnknownRequest
from rollpacker.core.errors import ConfigError
from rollpacker.core.protocols import GenerationRequest, GenerationResult

BAD_BATCHES = [
    ["not a request"],
    [GenerationRequest("", (1, 2), 4)],
    [request(2), GenerationRequest("rp000000000003", (), 4)],
    [request(4), request(4)],  # twice in one batch
    [request(1)],  # running already
]


def refusals(engine) -> list[tuple[type, str]]:
    """Submit request 1 (it stays in flight), then each bad batch and an unknown abort: what each raised."""
    engine.submit([request(1)])
    seen = []
    for batch in BAD_BATCHES:
        with pytest.raises((ConfigError, BackendMisuse)) as info:
            engine.submit(batch)
        seen.append((type(info.value), str(info.value)))
    with pytest.raises(BackendMisuse) as info:
        engine.abort(["rp000000000099"])
    seen.append((type(info.value), str(info.value)))
    return seen


@pytest.mark.timeout(120)
def test_embedded_and_sglang_engines_refuse_bad_requests_alike():
    pytest.importorskip("torch")
    from rollpacker.backends.embedded.engine import EmbeddedEngine
    from rollpacker.backends.models import load_model, tiny_random_llama
    from rollpacker.backends.sglang.client import SGLangEngine

    model, _ = load_model(tiny_random_llama())
    with EmbeddedEngine(model, capacity=2) as embedded:
        embedded.pause()  # request 1 stays in flight
        from_embedded = refusals(embedded)
        embedded.abort(["rp000000000001"])  # then the one result: nothing of a refused batch was queued
        results = first_results(embedded) + [e for e in embedded.poll(0.5) if isinstance(e, GenerationResult)]
        assert [(r.request_id, r.finish_reason) for r in results] == [("rp000000000001", "abort")]
    app = fake_sglang(silent_stream)
    try:
        with SGLangEngine([app.url], http=FAST, capacity_per_server=4, stall_timeout_s=60) as sglang:
            from_sglang = refusals(sglang)
            sglang.abort(["rp000000000001"])
    finally:
        app.close()
    assert from_embedded == from_sglang
    assert [t for t, _ in from_sglang] == [ConfigError] * 3 + [BackendMisuse] * 2 + [UnknownRequest]
    assert "rp000000000004" in from_sglang[3][1] and "duplicate request_id" in from_sglang[4][1]
