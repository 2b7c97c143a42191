"""The pool's state and its decisions: which GPUs are free, who holds the others, who waits.

Pure and synchronous with an injected clock: nothing here sleeps, spawns or signals. The
caller (the hub's spawner, the tuner's controller, or the simulation in ``benchmarks/pool.py``)
acts on what it is told, a :class:`~tunehub_base.pool.decisions.Start` (run on these GPUs) or a
:class:`~tunehub_base.pool.decisions.Preemption` (SIGTERM that trial), and reports back with
:meth:`Scheduler.release` when a holding ends. The order and the victims are the
:class:`~tunehub_base.pool._base.Policy`'s; the scheduler keeps the GPUs, holdings and usage.

A preempted trial keeps its GPUs until it exits (its grace period); they then go to the head of
the queue, which is the request it was stopped for unless something more urgent came meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from tunehub_base.pool._base import Policy
from tunehub_base.pool.decisions import (
    Action,
    Decision,
    Preemption,
    QueueEntry,
    Released,
    Start,
)
from tunehub_base.pool.request import GpuRequest, Holding
from tunehub_base.pool.usage import UsageReport


class Scheduler:
    """Whole GPUs handed out by ``policy``; times from ``clock`` (seconds)."""

    def __init__(self, gpu_ids: Sequence[str], policy: Policy,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if len(set(gpu_ids)) != len(gpu_ids):
            raise ValueError("gpu_ids must be distinct")
        self.gpu_ids = tuple(gpu_ids)
        self.policy = policy
        self.clock = clock
        policy.bind(len(self.gpu_ids))
        self._free: list[str] = list(reversed(self.gpu_ids))  # a stack: pop() gives gpu_ids[0]
        self.holdings: dict[str, Holding] = {}
        self._waiting: dict[str, GpuRequest] = {}
        #: GPUs on their way back from preempted trials, per request they were stopped for.
        self._incoming: dict[str, int] = {}
        self._stopping_for: dict[str, str] = {}  # victim request id -> beneficiary's
        self._usage = UsageReport()
        self.waiting_gpus = 0

    @property
    def free_gpus(self) -> int:
        return len(self._free)

    @property
    def held_gpus(self) -> int:
        return len(self.gpu_ids) - len(self._free)

    # -- decisions -------------------------------------------------------------------------

    def submit(self, request: GpuRequest) -> Decision:
        """Queue ``request`` and run a scheduling pass: it starts now, or waits with its
        position and reason (and the pass may have preempted a trial for it)."""
        if request.request_id in self._waiting or request.request_id in self.holdings:
            raise ValueError(f"request {request.request_id!r} is already in the pool")
        if request.gpus > len(self.gpu_ids):
            raise ValueError(f"request {request.request_id!r} wants {request.gpus} GPUs; "
                             f"the pool has {len(self.gpu_ids)}")
        self._enqueue(request)
        actions = self.schedule()
        holding = self.holdings.get(request.request_id)
        if holding is not None:
            return Decision(request, holding, None, "started", actions)
        position = self.policy.position(request)
        return Decision(request, None, position, self._reason(request, position - 1), actions)

    def submit_all(self, requests: Sequence[GpuRequest]) -> list[Action]:
        """Queue every one of ``requests``, then run one scheduling pass: how a caller that
        lays out everyone waiting at once (the local queue, at each decision) gets the
        policy's order, instead of the first submitted starting before a later, more
        urgent one is even in the queue."""
        for request in requests:
            if request.request_id in self._waiting or request.request_id in self.holdings:
                raise ValueError(f"request {request.request_id!r} is already in the pool")
            if request.gpus > len(self.gpu_ids):
                raise ValueError(f"request {request.request_id!r} wants {request.gpus} GPUs; "
                                 f"the pool has {len(self.gpu_ids)}")
        for request in requests:
            self._enqueue(request)
        return self.schedule()

    def schedule(self) -> list[Action]:
        """Start whatever can start, in the policy's order; when the head cannot fit, ask the
        policy whom to stop for it (at most once per GPU it lacks), then stop: nothing behind
        the head jumps it (no backfill), so a large request is not starved."""
        actions: list[Action] = []
        while (request := self.policy.head()) is not None:
            if request.gpus <= len(self._free):
                actions.append(Start(self._start(request)))
                continue
            need = request.gpus - len(self._free) - self._incoming.get(request.request_id, 0)
            if need > 0:
                now = self.clock()
                for victim in self.policy.victims(request, need, now):
                    victim.stopping = True
                    self.policy.stopping(victim)
                    self._incoming[request.request_id] = (
                        self._incoming.get(request.request_id, 0) + len(victim.gpu_ids))
                    self._stopping_for[victim.request_id] = request.request_id
                    actions.append(Preemption(victim, request, victim.checkpoint_age(now)))
            break
        return actions

    def release(self, request_id: str) -> Released:
        """The holding of ``request_id`` ended (finished, failed, cancelled, or stopped after a
        preemption). Its GPUs are free; a preempted trial is queued again in its old place.
        Call :meth:`schedule` afterwards to hand the GPUs on."""
        holding = self.holdings.pop(request_id)
        now = self.clock()
        self._free.extend(holding.gpu_ids)
        used = len(holding.gpu_ids) * (now - holding.since)
        self._usage.add(holding, used)
        self.policy.ended(holding)
        beneficiary = self._stopping_for.pop(request_id, None)
        if beneficiary is not None:
            left = self._incoming.get(beneficiary, 0) - len(holding.gpu_ids)
            if left > 0:
                self._incoming[beneficiary] = left
            else:
                self._incoming.pop(beneficiary, None)
        if not holding.stopping:
            return Released(holding, used)
        lost = holding.checkpoint_age(now)
        self._usage.lost_to_preemption[holding.request.person] += lost * len(holding.gpu_ids)
        requeued = holding.request.requeued()
        self._enqueue(requeued)
        return Released(holding, used, lost, requeued)

    def adopt(self, request: GpuRequest, gpu_ids: Sequence[str], since: float,
              last_checkpoint_at: float = 0.0, stopping_for: str | None = None) -> Holding:
        """Record a holding that exists already, on exactly ``gpu_ids``, without deciding
        anything: how a caller whose truth lives elsewhere (lock files on one machine) lays
        the pool's present state out before asking for a decision. With ``stopping_for``,
        the holding is a victim already on its way out for that request id (its GPUs are
        counted as coming to it, so it is not stopped a second time)."""
        if request.request_id in self._waiting or request.request_id in self.holdings:
            raise ValueError(f"request {request.request_id!r} is already in the pool")
        if len(gpu_ids) != request.gpus or not set(gpu_ids) <= set(self._free):
            raise ValueError(f"request {request.request_id!r}: GPUs {list(gpu_ids)} are not "
                             f"{request.gpus} free GPUs of this pool")
        self._enqueue(request)
        for gpu in gpu_ids:
            self._free.remove(gpu)
        holding = self._hold(request, tuple(gpu_ids), since, last_checkpoint_at)
        if stopping_for is not None:
            holding.stopping = True
            self.policy.stopping(holding)
            self._incoming[stopping_for] = self._incoming.get(stopping_for, 0) + request.gpus
            self._stopping_for[request.request_id] = stopping_for
        return holding

    def stopping_for(self, request_id: str) -> list[Holding]:
        """The holdings on their way out to free GPUs for ``request_id``."""
        return [self.holdings[victim] for victim, beneficiary in self._stopping_for.items()
                if beneficiary == request_id and victim in self.holdings]

    def withdraw(self, request_id: str) -> None:
        """A waiting request gives up (cancelled sweep, abandoned spawn)."""
        request = self._waiting.pop(request_id)
        self.waiting_gpus -= request.gpus
        self._incoming.pop(request_id, None)
        self.policy.withdraw(request)

    def checkpointed(self, request_id: str, at: float | None = None) -> None:
        """The trial holding ``request_id`` saved a checkpoint (now, or at ``at``)."""
        holding = self.holdings[request_id]
        holding.last_checkpoint_at = self.clock() if at is None else at
        self.policy.checkpointed(holding)

    # -- views -----------------------------------------------------------------------------

    def queue(self) -> list[QueueEntry]:
        """Everyone waiting, in order, each with a position (1 = next) and a reason."""
        return [QueueEntry(r, i + 1, self._reason(r, i))
                for i, r in enumerate(self.policy.ordered_waiting())]

    def usage(self) -> UsageReport:
        """Allocated GPU-seconds so far, running holdings included up to now."""
        return self._usage.with_running(self.holdings.values(), self.clock())

    # -- internals -------------------------------------------------------------------------

    def _enqueue(self, request: GpuRequest) -> None:
        self._waiting[request.request_id] = request
        self.waiting_gpus += request.gpus
        self.policy.enqueue(request)

    def _start(self, request: GpuRequest) -> Holding:
        gpus = tuple(self._free.pop() for _ in range(request.gpus))
        return self._hold(request, gpus, self.clock())

    def _hold(self, request: GpuRequest, gpus: tuple[str, ...], since: float,
              last_checkpoint_at: float = 0.0) -> Holding:
        """The waiting ``request`` holds ``gpus`` (already taken off the free list); the
        policy sees its checkpoint time from the start (it orders victims by it)."""
        del self._waiting[request.request_id]
        self.waiting_gpus -= request.gpus
        self._incoming.pop(request.request_id, None)
        holding = Holding(request, gpus, since, last_checkpoint_at)
        self.holdings[request.request_id] = holding
        self.policy.started(holding)
        return holding

    def _reason(self, request: GpuRequest, ahead: int) -> str:
        if self._incoming.get(request.request_id):
            return "waiting: a trial is stopping to free its GPUs for you"
        return self.policy.wait_reason(request, ahead)
