"""Random batches of requests for embedded engine tests: request specs (a hypothesis strategy) and
a driver that submits them in waves, aborts some, and collects exactly one result per request."""

from __future__ import annotations

import time

from hypothesis import strategies as st

from rollpacker.core.protocols import GenerationProgress, GenerationRequest, GenerationResult

MAX_NEW = 16
# group g's prompt: short repeating patterns, so n-gram drafts also match a row's own context
PROMPTS = [(5, 6, 7, 5, 6, 7, 5, 6), (901, 902, 903, 904, 901, 902), (42, 4242, 42, 4242, 42)]
RESUMED = (17, 18, 19)
LONGEST_ROW = max(map(len, PROMPTS)) + len(RESUMED) + MAX_NEW
"""Prompt + resumed + new tokens of the longest request a spec can make (a KV cache sized up front)."""

request_specs = st.lists(
    st.fixed_dictionaries({
        "max_new": st.integers(1, MAX_NEW),
        "group": st.integers(0, len(PROMPTS) - 1),
        "greedy": st.booleans(),
        "resumed": st.integers(0, len(RESUMED)),
        "wave": st.integers(0, 2),
        "abort": st.booleans(),
    }),
    min_size=1, max_size=8,
)


def spec(max_new: int, group: int = 0, greedy: bool = True, resumed: int = 0, wave: int = 0, abort: bool = False) -> dict:
    return {"max_new": max_new, "group": group, "greedy": greedy, "resumed": resumed, "wave": wave, "abort": abort}


def make_requests(specs) -> list[GenerationRequest]:
    """Request `r{i}` of spec i; siblings (same prompt) share a group, so they draft from each other."""
    return [GenerationRequest(f"r{i}", PROMPTS[s["group"]], s["max_new"], temperature=0.0 if s["greedy"] else 1.0,
                              seed=i, resume_ids=RESUMED[: s["resumed"]], group=f"g{s['group']}")
            for i, s in enumerate(specs)]


def run_waves(engine, specs, timeout_s: float = 120.0) -> tuple[dict[str, GenerationResult], list[GenerationProgress]]:
    """Submit wave by wave (later waves join while earlier ones run), abort the marked requests of
    each wave just after a short poll, then collect every result; after close, nothing more may
    come (a second result for a request fails)."""
    requests = make_requests(specs)
    results: dict[str, GenerationResult] = {}
    progress: list[GenerationProgress] = []

    def take(events) -> None:
        for e in events:
            if isinstance(e, GenerationResult):
                assert e.request_id not in results, f"two results for {e.request_id}: {results[e.request_id]} and {e}"
                results[e.request_id] = e
            else:
                progress.append(e)

    for wave in range(3):
        batch = [r for r, s in zip(requests, specs) if s["wave"] == wave]
        if not batch:
            continue
        engine.submit(batch)
        take(engine.poll(0.02))
        engine.abort([r.request_id for r, s in zip(requests, specs) if s["wave"] == wave and s["abort"]])
    deadline = time.monotonic() + timeout_s
    while len(results) < len(requests):
        assert time.monotonic() < deadline, f"only {len(results)} of {len(requests)} results in {timeout_s} s"
        take(engine.poll(0.5))
    engine.close()
    take(engine.poll(0.0))
    return results, progress
