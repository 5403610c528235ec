"""Length-aware prompt pool: which prompt comes next, where every prompt of the epoch is, and what
its response lengths have been (the `LengthHistory` of length_history.py).

Theory of operation
-------------------
The dataset is an endless sequence of epochs (or `epochs` of them: then `take` draws nothing once
they are all drawn); epoch e visits the prompts in a seeded permutation.
A `PromptKey(epoch, index)` is one prompt of one epoch, the unit trained exactly once.  A key is in
one of four states:

    fresh      not drawn yet: at or after the cursor of the current epoch, or in `returned`
    in flight  drawn by a round and not yet trained (requests may be running)
    deferred   waiting in the long queue (tail batching's long round)
    completed  trained (drawn, and in neither `in_flight` nor `deferred`)

Only the cursor, the returned and deferred queues and the in-flight set are stored; "completed" is
derived, so the state stays small whatever the dataset size.  The length history is recorded once
per round (`record_lengths`), so every event stays cheap.

    take(n)          fresh -> in flight (returned keys first, then the epoch order)
    take_deferred(n) deferred -> in flight (FIFO)
    defer(keys)      in flight -> deferred
    release(keys)    in flight -> fresh (front of the queue: drawn again first)
    complete(keys)   in flight -> completed
    recover()        every in-flight key -> fresh (after a restart: the engine lost them)

Invariant: each key is in exactly one state; an illegal move raises `SchedulerMisuse` naming the key.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence

import attrs
import numpy as np
from attrs import field, frozen

from .errors import ConfigError, SchedulerMisuse
from .length_history import LengthHistory, LengthPrediction
from .records import PromptKey
from .states import Move, PromptStatus, transition
from .validators import optional_positive, positive

FRESH, IN_FLIGHT, DEFERRED, COMPLETED = PromptStatus

@functools.lru_cache(maxsize=8)
def epoch_order(num_prompts: int, seed: int, epoch: int) -> np.ndarray:
    """The seeded visiting order of epoch `epoch` (read-only)."""
    order = np.random.default_rng([seed, epoch]).permutation(num_prompts)
    order.flags.writeable = False
    return order


@functools.lru_cache(maxsize=8)
def _epoch_position(num_prompts: int, seed: int, epoch: int) -> np.ndarray:
    position = np.empty(num_prompts, dtype=np.int64)
    position[epoch_order(num_prompts, seed, epoch)] = np.arange(num_prompts)
    position.flags.writeable = False
    return position


@frozen
class PromptPool:
    """Immutable pool state; every operation returns a new pool."""

    num_prompts: int = field(validator=positive)
    seed: int = 0
    epoch: int = 0
    cursor: int = 0
    """Position of the next fresh prompt in the current epoch's order."""
    returned: tuple[PromptKey, ...] = ()
    """Keys given back (released or recovered): drawn before the epoch order."""
    deferred: tuple[PromptKey, ...] = ()
    """The long queue, oldest first."""
    in_flight: frozenset[PromptKey] = frozenset()
    history: LengthHistory = field(default=None, eq=False)
    epochs: int | None = field(default=None, validator=optional_positive)
    """Most epochs drawn (None: endless); `take` returns fewer keys than asked once they are drawn."""

    def __attrs_post_init__(self) -> None:
        if self.history is None:
            object.__setattr__(self, "history", LengthHistory.empty(self.num_prompts))

    # -- queries ---------------------------------------------------------------------------------

    def status(self, key: PromptKey) -> PromptStatus:
        if key in self.in_flight:
            return IN_FLIGHT
        if key in self.deferred:
            return DEFERRED
        if key in self.returned or not self._drawn(key):
            return FRESH
        return COMPLETED

    def _drawn(self, key: PromptKey) -> bool:
        if key.epoch != self.epoch:
            return key.epoch < self.epoch
        return bool(_epoch_position(self.num_prompts, self.seed, self.epoch)[key.index] < self.cursor)

    @property
    def exhausted(self) -> bool:
        """Nothing fresh is left: every key of the last of `epochs` epochs is drawn, none returned."""
        return (self.epochs is not None and not self.returned and self.epoch == self.epochs - 1
                and self.cursor == self.num_prompts)

    def predict(self, index: int) -> LengthPrediction:
        return self.history.predict(index)

    # -- moves -----------------------------------------------------------------------------------

    def take(self, n: int) -> tuple[PromptPool, tuple[PromptKey, ...]]:
        """Draw `n` fresh keys (returned ones first, then the epoch order, rolling into new epochs);
        fewer once the last of `epochs` epochs is drawn."""
        keys = list(self.returned[:n])
        returned = self.returned[len(keys):]
        epoch, cursor = self.epoch, self.cursor
        while len(keys) < n:
            if cursor == self.num_prompts:
                if self.epochs is not None and epoch + 1 >= self.epochs:
                    break
                epoch, cursor = epoch + 1, 0
            order = epoch_order(self.num_prompts, self.seed, epoch)
            stop = min(self.num_prompts, cursor + n - len(keys))
            keys.extend(PromptKey(epoch, int(i)) for i in order[cursor:stop])
            cursor = stop
        if keys:
            transition(FRESH, Move.TAKE, keys)
        new = attrs.evolve(
            self, epoch=epoch, cursor=cursor, returned=returned, in_flight=self.in_flight.union(keys)
        )
        return new, tuple(keys)

    def take_deferred(self, n: int) -> tuple[PromptPool, tuple[PromptKey, ...]]:
        keys = self.deferred[:n]
        if keys:
            transition(DEFERRED, Move.TAKE, keys)
        return attrs.evolve(self, deferred=self.deferred[n:], in_flight=self.in_flight.union(keys)), keys

    def defer(self, keys: Iterable[PromptKey]) -> PromptPool:
        keys = tuple(keys)
        return attrs.evolve(self, deferred=self.deferred + keys, in_flight=self._leave(keys, Move.DEFER))

    def release(self, keys: Iterable[PromptKey]) -> PromptPool:
        keys = tuple(keys)
        return attrs.evolve(self, returned=keys + self.returned, in_flight=self._leave(keys, Move.RELEASE))

    def complete(self, keys: Iterable[PromptKey]) -> PromptPool:
        return attrs.evolve(self, in_flight=self._leave(tuple(keys), Move.COMPLETE))

    def recover(self) -> PromptPool:
        """After a restart: the engine lost every in-flight request, so draw those prompts again."""
        lost = tuple(sorted(self.in_flight))
        return attrs.evolve(self, returned=lost + self.returned, in_flight=self._leave(lost, Move.RELEASE))

    def record_lengths(
        self, indices: Sequence[int], lengths: Sequence[int], finished: Sequence[bool]
    ) -> PromptPool:
        if not len(indices):
            return self
        return attrs.evolve(self, history=self.history.record(indices, lengths, finished))

    def _leave(self, keys: tuple[PromptKey, ...], move: Move) -> frozenset[PromptKey]:
        """The in-flight set without `keys`, each making `move`; a key not in flight is refused by
        the transition table (states.py), a key named twice here too."""
        missing = [k for k in keys if k not in self.in_flight]
        if missing:  # the table has no edge out of FRESH, DEFERRED or COMPLETED but TAKE
            transition(self.status(missing[0]), move, missing[0])
            raise SchedulerMisuse(f"prompt {missing[0]} is {self.status(missing[0]).name}, not in flight: "
                                  f"it can't {move.name}")
        if len(set(keys)) != len(keys):
            raise SchedulerMisuse(f"prompt keys {keys} name a key twice: each moves ({move.name}) once")
        if keys:
            transition(IN_FLIGHT, move, keys)
        return self.in_flight.difference(keys)

    # -- checkpoints -----------------------------------------------------------------------------

    def to_dict(self) -> dict:
        """A plain dict (JSON-able) holding the whole pool, history included: `attrs.asdict`, with
        the in-flight set sorted and the history's arrays as lists."""
        return attrs.asdict(self, value_serializer=_plain)

    @classmethod
    def from_dict(cls, data: dict) -> PromptPool:
        """Inverse of `to_dict`; a missing field is a `ConfigError` naming it."""
        try:
            keys = lambda name: tuple(PromptKey(**k) for k in data[name])  # noqa: E731
            pool = cls(
                **{name: int(data[name]) for name in ("num_prompts", "seed", "epoch", "cursor")},
                returned=keys("returned"),
                deferred=keys("deferred"),
                in_flight=frozenset(keys("in_flight")),
                history=LengthHistory.from_dict(data["history"]),
                epochs=data.get("epochs"),  # absent from checkpoints written before the epoch limit
            )
        except KeyError as exc:
            raise ConfigError(f"prompt pool checkpoint is missing field {exc.args[0]!r}") from None
        except TypeError:  # before 0.1's checkpoint change prompt keys were [epoch, index] pairs
            raise ConfigError("prompt pool checkpoint: prompt keys are not {epoch, index} mappings (a state "
                              "saved by an older rollpacker; resume it with the version that wrote it)") from None
        if len(pool.history.count) != pool.num_prompts:
            raise ConfigError(
                f"prompt pool checkpoint: history has {len(pool.history.count)} prompts, num_prompts={pool.num_prompts}"
            )
        return pool

    def same_as(self, other: PromptPool) -> bool:
        """Equality including the length history (attrs eq skips the arrays)."""
        return self == other and self.history.same_as(other.history)


def _plain(instance, attribute, value):
    """`attrs.asdict` hook: JSON-able values (a sorted list for a set, a list for an array)."""
    if isinstance(value, frozenset):
        return sorted(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value
