"""The n-gram drafter: continuations from a row's own context and its siblings', longest match
first, lazy incremental indexing equal to indexing from scratch, and a bounded memory of groups."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rollpacker.backends.embedded.drafter import Drafter

PROMPT = [1, 2, 3, 4]


def test_own_repeated_phrase_and_no_self_match():
    d = Drafter(ngram=3)
    tokens = PROMPT + [10, 11, 12, 13, 10, 11]
    d.track("a", "g", tokens, len(PROMPT))
    assert d.propose("a", 3) == [12, 13, 10]  # after "10 11" came "12 13 10" before
    d.track("b", "h", [5, 6, 7], 3)
    assert d.propose("b", 3) == []  # its own suffix is not a match of itself


def test_sibling_continuation_and_longest_match_wins():
    d = Drafter(ngram=3)
    sib = PROMPT + [20, 21, 22, 23, 24]
    d.track("s", "g", sib, len(PROMPT))
    d.release("s")  # finished siblings stay a source
    me = PROMPT + [20, 21]
    d.track("m", "g", me, len(PROMPT))
    assert d.propose("m", 2) == [22, 23]
    me += [30, 21]  # the bigram "30 21" is new; "21" alone is below min_ngram
    assert d.propose("m", 2) == []

    d = Drafter(ngram=3)
    d.track("s", "g", PROMPT + [20, 21, 22, 23], len(PROMPT))
    d.track("o", "g", PROMPT + [7, 20, 21, 99], len(PROMPT))  # "20 21" -> 99 is the newer bigram
    d.track("m", "g", PROMPT + [20, 21], len(PROMPT))
    assert d.propose("m", 2) == [22, 23]  # the 3-gram "4 20 21" (only in "s") wins


def test_lru_bound_on_finished_groups_and_tracked_group_survives():
    d = Drafter(ngram=2, max_groups=2)
    for g in range(5):
        d.track(f"r{g}", g, PROMPT + [g, g], len(PROMPT))
        d.release(f"r{g}")
    assert d.num_groups == 2
    d.track("x", 4, PROMPT + [4], len(PROMPT))  # group 4 is still remembered
    assert d.propose("x", 1) == [4]


def _scratch_proposal(seqs: dict[str, list[int]], order: list[str], me: str, k: int, ngram: int, min_ngram: int):
    """Reference: scan every earlier occurrence, last-indexed wins, longest n first."""
    best = None
    for n in range(ngram, min_ngram - 1, -1):
        suffix = seqs[me][-n:]
        if len(seqs[me]) < n:
            continue
        for sid in order:
            toks = seqs[sid]
            for pos in range(n, len(toks)):
                if toks[pos - n : pos] == suffix:
                    best = toks[pos : pos + k]
        if best is not None:
            return best
    return []


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.lists(st.integers(0, 3), min_size=1, max_size=6)), min_size=1, max_size=8),
       st.integers(1, 4))
def test_incremental_indexing_equals_scratch(steps, k):
    d = Drafter(ngram=3, min_ngram=2)
    seqs = {"a": [9, 9], "b": [9, 9]}
    d.track("a", "g", seqs["a"], 2)
    d.track("b", "g", seqs["b"], 2)
    for who, new in steps:
        sid = "ab"[who]
        seqs[sid].extend(new)
        got = d.propose(sid, k)
        expect = _scratch_proposal(seqs, ["a", "b"], sid, k, 3, 2)
        # the indexed occurrence is "most recent in indexing order": both must be real matches
        # of the same (longest) length, and equal whenever a single occurrence exists
        assert bool(got) == bool(expect)
        if got:
            n = next(n for n in (3, 2) if len(seqs[sid]) >= n and any(
                seqs[o][p - n : p] == seqs[sid][-n:] for o in "ab" for p in range(n, len(seqs[o]))))
            assert any(seqs[o][p - n : p] == seqs[sid][-n:] and seqs[o][p : p + k] == got
                       for o in "ab" for p in range(n, len(seqs[o])))


def test_kept_groups_outlive_the_churn_and_a_dropped_one_goes_first():
    d = Drafter(ngram=2, max_groups=2)
    d.track("d", "deferred", PROMPT + [7, 8], len(PROMPT))
    d.release("d")
    d.keep({"deferred"})
    for g in range(5):  # more idle groups than max_groups run in between
        d.track(f"r{g}", g, PROMPT + [g, g], len(PROMPT))
        d.release(f"r{g}")
    assert d.num_groups == 3  # the 2 newest idle ones and the kept one
    d.track("long", "deferred", PROMPT + [7], len(PROMPT))
    assert d.propose("long", 1) == [8], "the deferred prompt's next round drafts from its text"
    d.release("long")
    d.keep(set())  # trained: the least recently used idle group now, the first out (at once: 2 are idle)
    assert d.num_groups == 2
    d.track("again", "deferred", PROMPT + [7], len(PROMPT))
    assert d.propose("again", 1) == []


def _remembered(d: Drafter, group: int) -> bool:
    """Whether `group` is still a source: a probe continuing its members' text gets a draft."""
    d.track(f"probe{group}", group, PROMPT + [group], len(PROMPT))
    return d.propose(f"probe{group}", 1) != []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 6), st.frozensets(st.integers(0, 6), max_size=3)),
                max_size=30),
       st.integers(0, 3))
def test_kept_groups_are_never_evicted_and_the_rest_stays_bounded(ops, max_groups):
    d = Drafter(ngram=2, max_groups=max_groups)
    kept, seen, fresh = frozenset(), set(), set()  # fresh: tracked since the last keep
    for n, (is_keep, group, groups) in enumerate(ops):
        if is_keep:
            d.keep(groups)
            kept, fresh = groups, set()
        else:
            d.track(f"r{n}", group, PROMPT + [group, 100 + n], len(PROMPT))
            d.release(f"r{n}")
            seen.add(group)
            fresh.add(group)
        assert d.num_groups <= max_groups + len(kept & seen)
    assert all(_remembered(d, g) for g in kept & fresh)
