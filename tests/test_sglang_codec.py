"""`StreamState` folds SGLang's streamed chunks into one result whatever the server's streaming
mode: cumulative (SGLang's default), incremental deltas (`--incremental-streaming-output`), or
count-only progress (rollpacker serve), mixed in any order the rules allow."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rollpacker.backends.sglang.codec import StreamState


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
