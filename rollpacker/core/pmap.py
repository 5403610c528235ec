"""A persistent map from small non-negative ints to values: a 32-way trie with path copying.

The core's state is immutable, yet an event must not copy a table of thousands of requests.  An
update here copies one node per level (log32 n tuples of 32 slots), so `set` costs about a
microsecond at 4096 keys and shares everything else with the previous version.  Keys are dense
(our request numbers and slot numbers count up from 0), which keeps the trie shallow.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Generic, TypeVar

V = TypeVar("V")

_BITS = 5
_WIDTH = 1 << _BITS
_MASK = _WIDTH - 1
_EMPTY_NODE: tuple = (None,) * _WIDTH
_MISSING = object()


class IntMap(Generic[V]):
    """Immutable int -> value map.  `set` and `remove` return a new map; the old one is unchanged."""

    __slots__ = ("_root", "_shift", "_len")

    def __init__(self, root: tuple = _EMPTY_NODE, shift: int = 0, length: int = 0) -> None:
        self._root = root
        self._shift = shift
        self._len = length

    def __len__(self) -> int:
        return self._len

    def get(self, key: int, default: Any = None) -> V | Any:
        if key < 0 or key >> (self._shift + _BITS):
            return default
        node = self._root
        shift = self._shift
        while shift:
            node = node[(key >> shift) & _MASK]
            if node is None:
                return default
            shift -= _BITS
        value = node[key & _MASK]
        return default if value is None else value[0]

    def __contains__(self, key: int) -> bool:
        return self.get(key, _MISSING) is not _MISSING

    def __getitem__(self, key: int) -> V:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def set(self, key: int, value: V) -> IntMap[V]:
        if key < 0:
            raise KeyError(f"IntMap keys are non-negative, got {key}")
        root, shift = self._root, self._shift
        while key >> (shift + _BITS):  # grow a level: the old root becomes child 0
            root = (root,) + (None,) * (_WIDTH - 1)
            shift += _BITS
        root, added = _assoc(root, shift, key, (value,))
        return IntMap(root, shift, self._len + added)

    def remove(self, key: int) -> IntMap[V]:
        if key not in self:
            raise KeyError(key)
        root, _ = _assoc(self._root, self._shift, key, None)
        return IntMap(root, self._shift, self._len - 1)

    def items(self) -> Iterator[tuple[int, V]]:
        yield from _walk(self._root, self._shift, 0)

    def keys(self) -> Iterator[int]:
        return (k for k, _ in self.items())

    def values(self) -> Iterator[V]:
        return (v for _, v in self.items())

    def __iter__(self) -> Iterator[int]:
        return self.keys()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IntMap) and len(self) == len(other) and dict(self.items()) == dict(other.items())

    def __hash__(self) -> int:  # frozen attrs states hash their fields
        return hash(tuple(self.items()))

    def __repr__(self) -> str:
        return f"IntMap({dict(self.items())!r})"

    @classmethod
    def from_dict(cls, mapping: dict[int, V]) -> IntMap[V]:
        result: IntMap[V] = cls()
        for key, value in mapping.items():
            result = result.set(key, value)
        return result


def _assoc(root: tuple, shift: int, key: int, boxed: tuple | None) -> tuple[tuple, int]:
    """Copy the path to `key` with its leaf set to `boxed` (None clears it, pruning nodes left
    empty); return (new root, entries added: 1, 0 or -1).  Iterative: one list copy per level."""
    path = []
    node = root
    while shift:
        path.append(node)
        child = node[(key >> shift) & _MASK]
        if child is None:
            if boxed is None:
                return root, 0
            child = _EMPTY_NODE
        node = child
        shift -= _BITS
    index = key & _MASK
    added = (boxed is not None) - (node[index] is not None)
    copy = list(node)
    copy[index] = boxed
    new: tuple | None = tuple(copy)
    for parent in reversed(path):
        shift += _BITS
        if new == _EMPTY_NODE:
            new = None
        copy = list(parent)
        copy[(key >> shift) & _MASK] = new
        new = tuple(copy)
    return new, added


def _walk(node: tuple, shift: int, base: int) -> Iterator[tuple[int, Any]]:
    for i, child in enumerate(node):
        if child is None:
            continue
        key = base | (i << shift)
        if shift == 0:
            yield key, child[0]
        else:
            yield from _walk(child, shift - _BITS, key)
