"""`StreamState` folds SGLang's streamed chunks into one result whatever the server's streaming
mode: cumulative (SGLang's default), incremental deltas (`--incremental-streaming-output`), or
count-only progress (rollpacker serve), mixed in any order the rules allow."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rollpacker.backends.sglang.codec import SERVER_TIMES, StreamState, way_back, way_in


def chunk(ids: list[int], count: int, *, final: bool = False) -> dict:
    meta = {"completion_tokens": count, "finish_reason": {"type": "length"} if final else None,
            "output_token_logprobs": [[-0.1 * t, t, None] for t in ids]}
    return {"output_ids": list(ids), "meta_info": meta}


@settings(max_examples=100, deadline=None)
@given(tokens=st.lists(st.integers(0, 50_000), min_size=1, max_size=60),
       cuts=st.lists(st.integers(1, 59), max_size=12),
       modes=st.lists(st.sampled_from(["cumulative", "delta", "count"]), min_size=13, max_size=13))
def test_any_mix_of_streaming_modes_folds_to_the_whole_response(tokens, cuts, modes):
    ends = sorted({c for c in cuts if c < len(tokens)} | {len(tokens)})
    state, sent = StreamState("rp000000000001", "http://s"), 0
    for i, end in enumerate(ends):
        final = end == len(tokens)
        mode = "cumulative" if final and modes[i] == "count" else modes[i]
        if mode == "cumulative":
            state.apply(chunk(tokens[:end], end, final=final))
            sent = end
        elif mode == "delta" and sent == state.num_tokens:  # a delta extends exactly what was received
            state.apply(chunk(tokens[sent:end], end, final=final))
            sent = end
        else:
            state.apply(chunk([], end) if not final else chunk(tokens[:end], end, final=True))
            sent = end if final else sent
        assert state.num_tokens == end
        if sent == end:
            assert state.token_ids == tokens[:end] and state.logprobs == [-0.1 * t for t in tokens[:end]]
    result = state.result(None, version=0)
    assert result.token_ids == tuple(tokens) and result.finish_reason == "length"
    assert result.logprobs == tuple(-0.1 * t for t in tokens)


def test_the_way_back_is_the_front_ends_finish_to_now_plus_the_schedulers_hop():
    meta = {"request_finished_ts": 100.0, "prefill_finished_time": 90.0, "response_sent_to_client_ts": 90.004}
    assert abs(way_back(meta, now=100.002) - 0.006) < 1e-9
    # A clock a hair behind the server's counts no negative leg; a server that says nothing gives None.
    assert abs(way_back(meta, now=99.999) - 0.004) < 1e-9
    for name in SERVER_TIMES:
        assert way_back({k: v for k, v in meta.items() if k != name}, now=100.002) is None
        assert way_back({**meta, name: None}, now=100.002) is None


def test_a_final_chunk_with_the_servers_times_gives_the_result_its_way_back():
    state = StreamState("rp000000000001", "http://s")
    state.apply(chunk([5, 6], 2))
    assert state.result(None, 0).way_back_s is None
    final = chunk([5, 6, 7], 3, final=True)
    final["meta_info"].update(request_finished_ts=1.0, prefill_finished_time=1.0, response_sent_to_client_ts=1.0)
    state.apply(final)
    assert 0.0 < state.result(None, 0).way_back_s  # (the chunk "arrived" long after its wall-clock second 1.0)


def test_the_way_in_is_the_sending_to_the_schedulers_queue():
    meta = {"forward_entry_time": 50.030, "queue_time": 0.020}
    assert abs(way_in(meta, sent_at=50.004) - 0.006) < 1e-9
    assert way_in(meta, sent_at=None) is None, "a request the client did not time"
    assert way_in({"queue_time": 0.02}, sent_at=50.0) is None and way_in({"forward_entry_time": 50.03}, 50.0) is None
