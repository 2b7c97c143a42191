"""Fixed per-person partitions as a baseline: everyone owns a slice of the pool.

Each person may hold at most their slice (the pool split evenly among the people named, or
``max_gpus`` from the share configuration), and a slice left idle stays idle: the "a GPU
machine per person" arrangement people fall back to when a shared pool is first come. Within a
slice, a person's notebooks go before their own trials; nobody is preempted.
"""

from __future__ import annotations

from collections.abc import Sequence

from tunehub_base.pool._base import CapHit
from tunehub_base.pool.fair import FairPolicy
from tunehub_base.pool.request import GpuRequest, Holding
from tunehub_base.pool.shares import Share, ShareConfig


class PartitionedPolicy(FairPolicy):
    """The fair policy's queue, but each person capped at a fixed slice and no preemption."""

    name = "partitioned"

    def __init__(self, people: Sequence[str], shares: ShareConfig | None = None) -> None:
        super().__init__(shares)
        self.people = tuple(people)
        self.slices: dict[str, int] = {}

    def bind(self, total_gpus: int) -> None:
        super().bind(total_gpus)
        base, extra = divmod(total_gpus, max(1, len(self.people)))
        for i, person in enumerate(self.people):
            configured = self.shares.people.get(person, Share()).max_gpus
            self.slices[person] = base + (i < extra) if configured is None else configured

    def cap_hit(self, request: GpuRequest) -> CapHit | None:
        size = self.slices.get(request.person, 0)
        if self.held_by_person[request.person] + request.gpus > size:
            return CapHit(f"person:{request.person}", size)
        return None

    def victims(self, request: GpuRequest, need: int, now: float) -> list[Holding]:
        return []

    def wait_reason(self, request: GpuRequest, ahead: int) -> str:
        size = self.slices.get(request.person, 0)
        return f"waiting: your partition of {size} GPUs is full"
