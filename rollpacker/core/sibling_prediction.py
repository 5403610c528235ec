"""Sibling-aware length prediction (after Seer, arXiv 2511.14617: requests of one prompt have
similar lengths, so a group's first finished samples predict the rest).

Theory of operation
-------------------
A group's predicted length is the shrunk mean of log length of its own finished siblings in this
round, with the pool's history of the prompt (earlier rounds and epochs) as the prior, worth
`PRIOR_WEIGHT` pseudo-samples: siblings first, history second.  A prompt never seen falls back on
the pooled prior.  Two floors (censoring): a group's unfinished samples will take at least as long
as its longest finished one, and a group with no finished sample in a round where samples launched
together have already finished at n tokens will take at least about n.  The pool's own prediction
uses the longest cut (aborted or truncated) length as its floor.

Two uses, both pure functions of the round's groups and the pool's history:

    longest_first(keys, history)     order a round's prompts longest-predicted first, so that where
                                     capacity (KV cache, running slots) is limited the longest work
                                     starts first (LPT scheduling: the makespan is not set by a long
                                     request that started late)
    groups_to_defer(...)             in a short round, the groups predicted longest, beyond the
                                     `keep` that must stay to fill the round
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from .length_history import PRIOR_WEIGHT, LengthHistory
from .records import PromptKey
from .round_state import Group


def group_predictions(groups: Sequence[Group], history: LengthHistory, clock: int = 0) -> np.ndarray:
    """Predicted length of each group (siblings first, history second, censored floors); `clock`
    is the longest length already finished in the round (the floor of a group with none)."""
    if not groups:
        return np.zeros(0)
    prior = np.log(np.maximum(history.predicted_medians([g.prompt.index for g in groups]), 1.0))
    out = np.empty(len(groups))
    for i, group in enumerate(groups):
        lengths = [max(s.num_tokens, 1) for s in group.kept]
        mean = (sum(math.log(n) for n in lengths) + PRIOR_WEIGHT * prior[i]) / (len(lengths) + PRIOR_WEIGHT)
        floor = max(lengths) if lengths else clock
        out[i] = max(math.exp(mean), floor)
    return out


def longest_first(keys: Iterable[PromptKey], history: LengthHistory) -> tuple[PromptKey, ...]:
    """Keys ordered by predicted length, longest first (stable: ties keep their order)."""
    keys = tuple(keys)
    if not keys:
        return keys
    predicted = history.predicted_medians([k.index for k in keys])
    order = np.argsort(-predicted, kind="stable")
    return tuple(keys[i] for i in order)


def groups_to_defer(live: Sequence[tuple[int, Group]], keep: int, history: LengthHistory,
                    clock: int) -> tuple[int, ...]:
    """Slots of the live (incomplete) groups to defer: all but the `keep` predicted shortest."""
    if len(live) <= keep:
        return ()
    predicted = group_predictions([g for _, g in live], history, clock)
    order = np.argsort(predicted, kind="stable")
    return tuple(live[i][0] for i in order[keep:])
