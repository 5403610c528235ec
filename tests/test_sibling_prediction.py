"""Sibling-aware prediction: properties over random groups and histories."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rollpacker.core.length_history import LengthHistory
from rollpacker.core.records import PromptKey, Sample, Segment, request_id
from rollpacker.core.round_state import Group
from rollpacker.core.sibling_prediction import group_predictions, groups_to_defer, longest_first

N = 12


def sample(number: int, index: int, sample_index: int, num_tokens: int) -> Sample:
    rid = request_id(number)
    return Sample(rid, PromptKey(0, index), sample_index, (Segment(rid, num_tokens, 0),), "stop")


@st.composite
def histories(draw):
    h = LengthHistory.empty(N)
    obs = draw(st.lists(st.tuples(st.integers(0, N - 1), st.integers(1, 20000), st.booleans()), max_size=40))
    if obs:
        h = h.record(*zip(*obs))
    return h


@st.composite
def groups(draw):
    out = []
    for slot, index in enumerate(draw(st.lists(st.integers(0, N - 1), min_size=1, max_size=10))):
        lengths = draw(st.lists(st.integers(1, 20000), max_size=4))
        kept = tuple(sample(100 * slot + i, index, i, n) for i, n in enumerate(lengths))
        out.append((slot, Group(PromptKey(0, index), kept=kept, running=frozenset({slot}))))
    return out


@given(history=histories(), live=groups(), clock=st.integers(0, 20000))
def test_prediction_floors(history, live, clock):
    predicted = group_predictions([g for _, g in live], history, clock)
    for (_, group), p in zip(live, predicted):
        lengths = [s.num_tokens for s in group.kept]
        assert p >= (max(lengths) if lengths else clock) - 1e-6
        assert p > 0


@given(history=histories(), live=groups(), keep=st.integers(0, 12), clock=st.integers(0, 20000))
def test_defer_keeps_the_predicted_shortest(history, live, keep, clock):
    deferred = groups_to_defer(live, keep, history, clock)
    assert len(deferred) == max(0, len(live) - keep)
    assert len(set(deferred)) == len(deferred) and set(deferred) <= {s for s, _ in live}
    predicted = dict(zip((s for s, _ in live), group_predictions([g for _, g in live], history, clock)))
    kept = [s for s, _ in live if s not in deferred]
    if deferred and kept:
        assert max(predicted[s] for s in kept) <= min(predicted[s] for s in deferred)


@given(history=histories(), indices=st.lists(st.integers(0, N - 1), unique=True, max_size=N))
def test_longest_first_is_a_sorted_permutation(history, indices):
    keys = [PromptKey(1, i) for i in indices]
    ordered = longest_first(keys, history)
    assert sorted(ordered) == sorted(keys)
    medians = history.predicted_medians([k.index for k in ordered]) if ordered else []
    assert all(a >= b for a, b in zip(medians, medians[1:]))


def test_siblings_outweigh_history():
    h = LengthHistory.empty(2).record([0, 0, 1, 1], [10000, 10000, 10000, 10000], [True] * 4)
    short = Group(PromptKey(0, 0), kept=tuple(sample(i, 0, i, 100) for i in range(4)))
    none = Group(PromptKey(0, 1))
    p_short, p_none = group_predictions([short, none], h, clock=0)
    assert p_short < 1000 < p_none   # four short siblings beat a long history
