"""Today's behaviour as a baseline: one line, first come first served, nobody yields.

What the flock-based :class:`tunehub_base.gpus.GpuPool` gives when everyone queues instead of
retrying: the oldest request gets the next free GPUs, whatever it is, and a notebook waits for
trials to end. Used by ``benchmarks/pool.py`` to measure what the fair policy changes.
"""

from __future__ import annotations

from collections import deque

from tunehub_base.pool._base import CapHit, Policy
from tunehub_base.pool.ranked import RankedKeys
from tunehub_base.pool.request import GpuRequest, Holding


class FirstComePolicy(Policy):
    """FIFO, no priorities, no shares, no caps, no preemption."""

    name = "first_come"

    def __init__(self) -> None:
        super().__init__()
        self._line: deque[GpuRequest] = deque()
        self._waiting: dict[str, GpuRequest] = {}
        #: Arrival numbers of those waiting, for a position without a scan of the line.
        self._arrivals: dict[str, int] = {}
        self._ranked: RankedKeys[int] = RankedKeys()
        self._seq = 0

    def enqueue(self, request: GpuRequest) -> None:
        self._line.append(request)
        self._waiting[request.request_id] = request
        self._seq += 1
        self._arrivals[request.request_id] = self._seq
        self._ranked.add(self._seq)

    def withdraw(self, request: GpuRequest) -> None:
        del self._waiting[request.request_id]
        self._ranked.remove(self._arrivals.pop(request.request_id))

    def head(self) -> GpuRequest | None:
        while self._line and self._line[0].request_id not in self._waiting:
            self._line.popleft()
        return self._line[0] if self._line else None

    def started(self, holding: Holding) -> None:
        del self._waiting[holding.request_id]
        self._ranked.remove(self._arrivals.pop(holding.request_id))
        self._line.popleft()

    def ended(self, holding: Holding) -> None:
        """Nothing to count: first come has no caps."""

    def cap_hit(self, request: GpuRequest) -> CapHit | None:
        return None

    def ordered_waiting(self) -> list[GpuRequest]:
        return [r for r in self._line if r.request_id in self._waiting]

    def position(self, request: GpuRequest) -> int:
        """Those still waiting that came before it: O(log n)."""
        return self._ranked.weight_below(self._arrivals[request.request_id]) + 1
