"""A min-heap whose items can change key or leave in O(log n), for the policies' orderings.

The fair policy orders accounts by a share that changes whenever one of their GPUs is taken or
freed; rescanning every account per decision would make a decision cost grow with the pool.
Instead each change pushes a fresh entry and the old one is skipped when it surfaces (lazy
deletion); the heap is rebuilt when stale entries outnumber live ones, so it stays O(live).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable
from typing import Any, Generic, TypeVar

Item = TypeVar("Item", bound=Hashable)


class KeyedHeap(Generic[Item]):
    """Items with a key each; :meth:`peek`/:meth:`pop` give the item of the smallest key
    (ties: first set first)."""

    def __init__(self) -> None:
        self._heap: list[tuple[Any, int, Item]] = []
        self._live: dict[Item, tuple[Any, int]] = {}
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, item: object) -> bool:
        return item in self._live

    def key(self, item: Item) -> Any:
        return self._live[item][0]

    def set(self, item: Item, key: Any) -> None:
        """Insert ``item`` or change its key."""
        current = self._live.get(item)
        if current is not None and current[0] == key:
            return
        seq = next(self._seq)
        self._live[item] = (key, seq)
        heapq.heappush(self._heap, (key, seq, item))
        if len(self._heap) > 2 * len(self._live) + 32:
            self._heap = [(k, s, i) for i, (k, s) in self._live.items()]
            heapq.heapify(self._heap)

    def discard(self, item: Item) -> None:
        self._live.pop(item, None)

    def peek(self) -> Item | None:
        heap = self._heap
        while heap:
            key, seq, item = heap[0]
            if self._live.get(item, (None, -1))[1] == seq:
                return item
            heapq.heappop(heap)
        return None

    def pop(self) -> Item | None:
        item = self.peek()
        if item is not None:
            heapq.heappop(self._heap)
            del self._live[item]
        return item
