"""Distinct keys in order, each with a weight, for a request's place in the queue in O(log n).

A waiting request's position is the number of requests served before it: those of every
account ordered before its account in its tier, plus its own account's older ones. The fair
policy keeps one :class:`RankedKeys` per tier (accounts keyed by dominant share then oldest
request, weighted by how many requests they have waiting) and one per account's lane (its
waiting requests by arrival), so a position is two :meth:`RankedKeys.weight_below` calls
instead of a scan of every account.

The keys live in sorted blocks of at most ``2 * LOAD`` (found with :func:`bisect.bisect_left`,
moved with list inserts of bounded size), and the blocks' total weights in a Fenwick tree, so
inserting, removing, re-weighting a key and the weight below a key each cost O(log n); the tree
is rebuilt only when a block is split or merged, at most once per ``LOAD / 4`` changes.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

Key = TypeVar("Key", bound=Any)  # anything totally ordered: numbers, tuples of them and strings


class RankedKeys(Generic[Key]):
    """A sorted set of keys with an integer weight each."""

    LOAD = 64

    def __init__(self) -> None:
        self._blocks: list[list[Key]] = []
        self._weights: list[list[int]] = []
        self._maxes: list[Key] = []
        self._sums: list[int] = []
        self._tree: list[int] = [0]  # Fenwick tree over _sums, 1-based
        self._len = 0
        self.total = 0

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Key]:
        for block in self._blocks:
            yield from block

    def first(self) -> Key | None:
        """The smallest key, or None when empty."""
        return self._blocks[0][0] if self._blocks else None

    def add(self, key: Key, weight: int = 1) -> None:
        """Insert ``key`` (not present yet) with ``weight``."""
        self._len += 1
        self.total += weight
        if not self._blocks:
            self._blocks.append([key])
            self._weights.append([weight])
            self._maxes.append(key)
            self._sums.append(weight)
            self._rebuild()
            return
        b = bisect_left(self._maxes, key)
        if b == len(self._blocks):
            b -= 1
        block = self._blocks[b]
        i = bisect_left(block, key)
        block.insert(i, key)
        self._weights[b].insert(i, weight)
        self._maxes[b] = block[-1]
        self._sums[b] += weight
        if len(block) > 2 * self.LOAD:
            half = len(block) // 2
            weights = self._weights[b]
            self._blocks[b:b + 1] = [block[:half], block[half:]]
            self._weights[b:b + 1] = [weights[:half], weights[half:]]
            self._maxes[b:b + 1] = [block[half - 1], block[-1]]
            self._sums[b:b + 1] = [sum(weights[:half]), sum(weights[half:])]
            self._rebuild()
        else:
            self._bump(b, weight)

    def remove(self, key: Key) -> None:
        """Take ``key`` (present) out."""
        b, i = self._find(key)
        block = self._blocks[b]
        del block[i]
        weight = self._weights[b].pop(i)
        self._len -= 1
        self.total -= weight
        self._sums[b] -= weight
        if len(block) * 4 < self.LOAD and len(self._blocks) > 1:
            self._merge(b)
        elif not block:  # the only block
            self._blocks.clear()
            self._weights.clear()
            self._maxes.clear()
            self._sums.clear()
            self._rebuild()
        else:
            self._maxes[b] = block[-1]
            self._bump(b, -weight)

    def reweight(self, key: Key, delta: int) -> None:
        """Add ``delta`` to the weight of ``key`` (present)."""
        b, i = self._find(key)
        self._weights[b][i] += delta
        self._sums[b] += delta
        self.total += delta
        self._bump(b, delta)

    def weight_below(self, key: Key) -> int:
        """The total weight of the keys smaller than ``key`` (which need not be present)."""
        b = bisect_left(self._maxes, key)
        if b == len(self._blocks):
            return self.total
        i = bisect_left(self._blocks[b], key)
        below = sum(self._weights[b][:i])
        tree = self._tree
        while b:
            below += tree[b]
            b -= b & -b
        return below

    # -- internals -------------------------------------------------------------------------

    def _find(self, key: Key) -> tuple[int, int]:
        b = bisect_left(self._maxes, key)
        if b < len(self._blocks):
            i = bisect_left(self._blocks[b], key)
            if i < len(self._blocks[b]) and self._blocks[b][i] == key:
                return b, i
        raise KeyError(key)

    def _bump(self, b: int, delta: int) -> None:
        tree = self._tree
        b += 1
        while b < len(tree):
            tree[b] += delta
            b += b & -b

    def _merge(self, b: int) -> None:
        """Block ``b`` ran low: join it to a neighbour (split again if that is too big)."""
        a = b - 1 if b else b  # join blocks a and a + 1
        keys = self._blocks[a] + self._blocks[a + 1]
        weights = self._weights[a] + self._weights[a + 1]
        if len(keys) > 2 * self.LOAD:
            half = len(keys) // 2
            self._blocks[a:a + 2] = [keys[:half], keys[half:]]
            self._weights[a:a + 2] = [weights[:half], weights[half:]]
            self._maxes[a:a + 2] = [keys[half - 1], keys[-1]]
            self._sums[a:a + 2] = [sum(weights[:half]), sum(weights[half:])]
        else:
            self._blocks[a:a + 2] = [keys]
            self._weights[a:a + 2] = [weights]
            self._maxes[a:a + 2] = [keys[-1]]
            self._sums[a:a + 2] = [sum(weights)]
        self._rebuild()

    def _rebuild(self) -> None:
        n = len(self._sums)
        tree = [0, *self._sums]
        for i in range(1, n + 1):
            j = i + (i & -i)
            if j <= n:
                tree[j] += tree[i]
        self._tree = tree
