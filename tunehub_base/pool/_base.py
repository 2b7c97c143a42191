"""What a pool policy is: the order of the queue, caps, and whom to stop for whom.

The :class:`~tunehub_base.pool.scheduler.Scheduler` owns the GPUs, the holdings and the clock;
a :class:`Policy` owns the waiting requests and whatever index it needs to answer "who next?"
and "who yields?" cheaply. One module per implementation: ``fair.py`` (the product's policy),
``first_come.py`` (today's first-come locks, as a baseline), ``partitioned.py`` (a fixed slice
per person, as a baseline).
"""

from __future__ import annotations

import abc
from collections import Counter
from typing import NamedTuple

from tunehub_base.pool.request import GpuRequest, Holding
from tunehub_base.pool.shares import ShareConfig


class CapHit(NamedTuple):
    """A cap that keeps a request waiting: whose (``person:NAME`` / ``group:NAME``), and its
    size in GPUs."""

    entity: str
    max_gpus: int

    def reason(self) -> str:
        kind, _, name = self.entity.partition(":")
        whose = "your" if kind == "person" else f"your group {name}'s"
        return f"over {whose} cap of {self.max_gpus} GPUs"


class Policy(abc.ABC):
    """Orders the queue and picks preemption victims; the scheduler calls it on every change."""

    name: str = "base"

    def __init__(self, shares: ShareConfig | None = None) -> None:
        self.shares = shares or ShareConfig()
        self.total_gpus = 0
        self.held_by_person: Counter[str] = Counter()
        self.held_by_group: Counter[str] = Counter()

    def bind(self, total_gpus: int) -> None:
        """The size of the pool this policy serves (called once by the scheduler)."""
        self.total_gpus = total_gpus

    @abc.abstractmethod
    def enqueue(self, request: GpuRequest) -> None:
        """``request`` waits from now on (a new one, or a preempted trial put back)."""

    @abc.abstractmethod
    def withdraw(self, request: GpuRequest) -> None:
        """``request`` no longer waits (cancelled, or the notebook's spawn gave up)."""

    @abc.abstractmethod
    def head(self) -> GpuRequest | None:
        """The request that gets the next free GPUs (skipping those a cap holds back)."""

    @abc.abstractmethod
    def started(self, holding: Holding) -> None:
        """The head started on ``holding.gpu_ids``: it leaves the queue."""

    @abc.abstractmethod
    def ended(self, holding: Holding) -> None:
        """``holding`` gave its GPUs back."""

    def victims(self, request: GpuRequest, need: int, now: float) -> list[Holding]:
        """Holdings to stop so ``request`` gets ``need`` more GPUs; empty: it waits. No
        preemption unless a policy says otherwise."""
        return []

    def stopping(self, holding: Holding) -> None:
        """``holding`` was chosen as a victim and is on its way out."""

    def checkpointed(self, holding: Holding) -> None:
        """``holding.last_checkpoint_at`` moved on."""

    @abc.abstractmethod
    def ordered_waiting(self) -> list[GpuRequest]:
        """Every waiting request in the order the policy would serve them now."""

    @abc.abstractmethod
    def position(self, request: GpuRequest) -> int:
        """``request``'s 1-based place in :meth:`ordered_waiting`, without building it."""

    def wait_reason(self, request: GpuRequest, ahead: int) -> str:
        """Why ``request`` waits, for people: a cap, else the full pool and who is ahead."""
        cap = self.cap_hit(request)
        if cap is not None:
            return cap.reason()
        return f"waiting: pool full; {ahead} ahead"

    def cap_hit(self, request: GpuRequest) -> CapHit | None:
        """The person's or a configured group's cap that ``request`` would exceed, if any."""
        share = self.shares.person(request.person)
        held = self.held_by_person[request.person]
        if share.max_gpus is not None and held + request.gpus > share.max_gpus:
            return CapHit(f"person:{request.person}", share.max_gpus)
        for group in request.groups:
            group_share = self.shares.groups.get(group)
            if group_share is None or group_share.max_gpus is None:
                continue
            if self.held_by_group[group] + request.gpus > group_share.max_gpus:
                return CapHit(f"group:{group}", group_share.max_gpus)
        return None

    def count(self, holding: Holding, sign: int) -> None:
        """Keep the per-person and per-group GPU counts that caps read."""
        request = holding.request
        self.held_by_person[request.person] += sign * request.gpus
        for group in request.groups:
            self.held_by_group[group] += sign * request.gpus
