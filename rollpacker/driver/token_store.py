"""The live backend's token store: what the engine answered for each request (token ids, log-probs)
and each kept sample's reward, kept while a sample may still be trained or a request resumed (a
carried group's samples are generated and scored in one step, trained in a later one)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from rollpacker.core.protocols import GenerationResult
from rollpacker.core.records import Segment


class TokenStore:
    def __init__(self) -> None:
        self.results: dict[str, GenerationResult] = {}
        """Results by request id."""
        self.rewards: dict[str, float] = {}
        """Rewards the core settled, by request id (only of results still held, after `begin_step`)."""

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.results

    def add(self, result: GenerationResult) -> None:
        self.results[result.request_id] = result

    def response_ids(self, segments: Sequence[Segment]) -> tuple[int, ...]:
        """The token ids of a sample (or a resumed prefix): its segments' requests' tokens, in order."""
        return tuple(t for seg in segments for t in self.results[seg.request_id].token_ids[: seg.num_tokens])

    def logprobs(self, segments: Sequence[Segment]) -> tuple[float, ...]:
        """The engine's log-probs of the same tokens."""
        return tuple(x for seg in segments for x in self.results[seg.request_id].logprobs[: seg.num_tokens])

    def keep_only(self, request_ids: Collection[str]) -> None:
        """The step is trained: only the results of `request_ids` (carried: a later round resumes or
        trains them) are still needed."""
        self.results = {rid: r for rid, r in self.results.items() if rid in request_ids}

    def begin_step(self) -> None:
        """A step starts: the rewards of results no longer held go."""
        self.rewards = {rid: r for rid, r in self.rewards.items() if rid in self.results}
