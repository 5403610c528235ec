"""The shapes of the embedded engine's decode forwards, with no torch: the rows buckets, the columns
buckets, and the key of every CUDA graph a runner captures for a KV cache of a given length.  The
runner (`runner.Runner`) captures exactly these; the memory plan (`rollpacker.train.memory_plan`),
which must not import torch, counts what they keep from the same list."""

from __future__ import annotations

ROW_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
COL_MULTIPLE = {"cuda": 256, "cpu": 16}
"""The columns a decode attends to are rounded up to a multiple of this (a graph serves every length
of its bucket), or to the cache's length."""

GraphKey = tuple[int, int, int]
"""(rows bucket, tokens per row, columns attended) of a decode forward."""


def row_bucket(n: int, capacity: int) -> int:
    """The rows a decode of `n` running rows is padded to."""
    for size in ROW_BUCKETS:
        if size >= n:
            return min(size, capacity)
    return capacity


def row_buckets(most_rows: int, capacity: int) -> list[int]:
    """The rows buckets of 1 .. most_rows running rows (each bucket's smallest count, no loop over all)."""
    counts = [1, *(size + 1 for size in ROW_BUCKETS)]
    return sorted({row_bucket(n, capacity) for n in counts if n <= most_rows})


def graph_keys(*, capacity: int, length: int, col_multiple: int, verify_rows: int, verify_tokens: int) -> list[GraphKey]:
    """Every (rows bucket, tokens per row, columns) a decode can use with a cache of `length` columns
    per slot: one token per row at every rows bucket, and 2 .. verify_tokens + 1 per row at the
    buckets of up to verify_rows rows (a verify forward is as wide as its longest draft).  In capture
    order: the largest forward (most rows x tokens, then most columns) first, so the transients it
    leaves free in the graphs' shared pool hold every later capture's."""
    cols = sorted({min(c, length) for c in range(col_multiple, length + col_multiple, col_multiple)})
    keys = [(r, 1, c) for r in row_buckets(capacity, capacity) for c in cols]
    keys += [(r, t, c) for r in row_buckets(min(verify_rows, capacity), capacity)
             for t in range(2, verify_tokens + 2) for c in cols if c > t]
    return sorted(keys, key=lambda k: (k[0] * k[1], k[2]), reverse=True)
