"""`drain`: the poll semantics shared by the embedded engine and the reward executor."""

from __future__ import annotations

import queue
from collections.abc import Callable


def drain(q: queue.Queue, timeout: float | None, is_idle: Callable[[], bool]) -> list:
    """Everything in `q`, after waiting up to `timeout` seconds for the first item.  With
    timeout None, wait until an item arrives, but return [] at once when `is_idle()` says nothing
    can arrive any more (so a poll never hangs on an idle producer)."""
    items = []
    try:
        if timeout is None:
            while True:
                idle = is_idle()
                try:
                    items.append(q.get(timeout=0.05 if idle else 0.5))
                    break
                except queue.Empty:
                    if idle:
                        break
        else:
            items.append(q.get(timeout=max(0.0, timeout)))
    except queue.Empty:
        pass
    while True:
        try:
            items.append(q.get_nowait())
        except queue.Empty:
            return items
