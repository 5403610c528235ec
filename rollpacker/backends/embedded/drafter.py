"""Draft tokens for speculative decoding, with no draft model: n-gram matches over a request's own
context and over its siblings' (the other samples of the same prompt, which share a lot of text).

Theory of operation
    Requests are grouped (`group`: the same prompt).  A group keeps every member's token list (the
    engine appends to it in place) and one index per n-gram size n in [min_ngram, ngram]: n-gram ->
    (member, position of the token that followed it), the most recent occurrence winning.  Indexing
    is lazy and incremental: a member's tokens are indexed when a propose in its group needs them,
    from where the last catch-up stopped, so rows that never speculate cost nothing and a propose
    costs O(new tokens + k).  The prompt is indexed once per group (siblings share it; each
    sibling's tokens are indexed from its first response token's n-grams on).

    `propose` looks up the row's longest suffix (n = ngram, then shorter) and returns the tokens
    that followed its most recent earlier occurrence.  The row's current suffix is never a match of
    itself: an n-gram is indexed only once the token after it exists.

    A finished or aborted member stays a source for its siblings and for later requests of the same
    prompt (a deferred prompt's next round), until its group is evicted: at most `max_groups`
    groups with no running member are kept (least recently used first out), besides the groups
    named by `keep`, which are never evicted while named.  The driver names the prompts drawn and
    not yet trained (`DraftKeepingEngine`), so a prompt deferred by a short round still drafts from
    that round's text in its long round, however many short rounds ran in between (until the step
    ends, the round's deferred groups are its newest idle ones: the last out).  Memory: kept
    groups are at most the prompts the core holds pending after a step (tail batching: the long
    queue, fewer than P x eta_prompts prompts), plus `max_groups` idle ones;
    a group holds its members' token lists (R x (prompt + response) ids) and, once a propose in
    the group indexed them, (ngram - min_ngram + 1) index entries per token: measured (CPython, R = 8
    members of 4,000 random tokens, no n-gram repeated: the worst case) 37 bytes a token for the
    lists and 344 more once indexed.  Drafts made from text
    generated under older weights stay valid after a weight update: a draft is only a proposal,
    the current model's verification decides every emitted token.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Hashable

from rollpacker.core.errors import ConfigError


class _Group:
    def __init__(self, ngram_sizes: range) -> None:
        self.sizes = ngram_sizes
        self.members: dict[str, int] = {}  # seq id -> source index
        self.sources: list[list[int]] = []
        self.indexed: list[int] = []  # per source: positions below this are indexed
        self.index: dict[tuple[int, ...], tuple[int, int]] = {}
        self.num_running = 0
        self.has_prompt = False

    def add(self, seq_id: str, tokens: list[int], num_prompt: int) -> None:
        self.members[seq_id] = len(self.sources)
        self.sources.append(tokens)
        # siblings share the prompt: index it once, then each member from its response on
        self.indexed.append(num_prompt if self.has_prompt else 1)
        self.has_prompt = True
        self.num_running += 1

    def catch_up(self) -> None:
        for src, tokens in enumerate(self.sources):
            start, end = self.indexed[src], len(tokens)
            for pos in range(start, end):  # tokens[pos] follows the n-grams ending at pos - 1
                for n in self.sizes:
                    if pos >= n:
                        self.index[tuple(tokens[pos - n : pos])] = (src, pos)
            self.indexed[src] = max(start, end)

    def propose(self, seq_id: str, k: int) -> list[int]:
        self.catch_up()
        tokens = self.sources[self.members[seq_id]]
        for n in reversed(self.sizes):
            if len(tokens) < n:
                continue
            hit = self.index.get(tuple(tokens[-n:]))
            if hit is not None:
                src, pos = hit
                return list(self.sources[src][pos : pos + k])
        return []


class Drafter:
    """n-gram drafts from a row's own context and its siblings' (see the module docstring)."""

    def __init__(self, *, ngram: int = 3, min_ngram: int = 2, max_groups: int = 256) -> None:
        if not 1 <= min_ngram <= ngram:
            raise ConfigError(f"need 1 <= min_ngram <= ngram, got min_ngram={min_ngram} ngram={ngram}")
        if max_groups < 0:
            raise ConfigError(f"max_groups must be >= 0, got {max_groups}")
        self.sizes = range(min_ngram, ngram + 1)
        self.max_groups = max_groups
        self._groups: dict[Hashable, _Group] = {}
        self._group_of: dict[str, Hashable] = {}
        self._idle: OrderedDict[Hashable, None] = OrderedDict()  # groups with no running member, LRU first
        self._kept: frozenset[Hashable] = frozenset()  # never evicted (`keep`), running or not

    @property
    def num_groups(self) -> int:
        return len(self._groups)

    def track(self, seq_id: str, group: Hashable, tokens: list[int], num_prompt: int) -> None:
        """Register a running row whose context list `tokens` (prompt, then generated tokens) the
        caller keeps appending to."""
        if seq_id in self._group_of:
            raise ConfigError(f"drafter: sequence {seq_id!r} is already tracked")
        g = self._groups.get(group)
        if g is None:
            g = self._groups[group] = _Group(self.sizes)
        self._idle.pop(group, None)
        g.add(seq_id, tokens, num_prompt)
        self._group_of[seq_id] = group

    def propose(self, seq_id: str, k: int) -> list[int]:
        """Up to `k` draft tokens to follow `seq_id`'s context (empty: no match)."""
        if k < 1:
            return []
        return self._groups[self._group_of[seq_id]].propose(seq_id, k)

    def release(self, seq_id: str) -> None:
        """The row finished or was aborted; its tokens stay a source for its group."""
        group = self._group_of.pop(seq_id, None)
        if group is None:
            return
        g = self._groups[group]
        g.num_running -= 1
        if g.num_running == 0 and group not in self._kept:
            self._idle[group] = None
            self._evict()

    def keep(self, groups: Collection[Hashable]) -> None:
        """Never evict `groups` (their prompts run again: a deferred prompt's next round) until a
        later call leaves them out; this call replaces the last one's set.  A group left out with
        no running member becomes the least recently used idle group: the first out."""
        kept = frozenset(groups)
        dropped = [g for g in self._kept - kept if g in self._groups and self._groups[g].num_running == 0]
        self._kept = kept
        for group in kept:
            self._idle.pop(group, None)
        for group in sorted(dropped, key=repr, reverse=True):
            self._idle[group] = None
            self._idle.move_to_end(group, last=False)
        self._evict()

    def _evict(self) -> None:
        while len(self._idle) > self.max_groups:
            old, _ = self._idle.popitem(last=False)
            del self._groups[old]
