"""The GPU pool's queue on one machine: notebooks that wait for GPUs, and the trials stopped
for them.

The GPUs' truth is the lock files (:mod:`tunehub_base.gpus`): who holds what is read from them
at every decision, never kept here. What this keeps is what the locks cannot say: which
notebooks wait (the hub's spawner asks again every second or so while it waits; a request not
asked for :data:`REQUEST_TTL_SECONDS` lapses), and which trials are on their way out for whom.

Each decision lays the present out for the pool's policy (:class:`tunehub_base.pool.Scheduler`
with :class:`~tunehub_base.pool.FairPolicy`): the holdings as the locks show them (adopted, a
trial being stopped marked as such), then the waiting notebooks, then the trials this tuner's
sweeps have waiting for GPUs. What it decides for a notebook is carried out here: each victim
attempt is preempted through its sweep's controller (SIGTERM, the grace period, SIGKILL; the
trial goes back to the queue, see :meth:`SweepController.preempt`). Only notebooks preempt
for now: a trial waiting behind a lower-priority trial waits (``trials_preempt=False``).

Trials never take the GPUs a waiting notebook is owed: the local backend starts an attempt only
on GPUs beyond :meth:`GpuQueue.reserved_gpus`, so the GPU a preemption frees waits for the
notebook's spawner to take it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunehub_base.gpu_holders import HolderBook
from tunehub_base.pool import (
    Action,
    FairPolicy,
    GpuRequest,
    Preemption,
    Scheduler,
    ShareConfig,
    Start,
)

if TYPE_CHECKING:
    from tuner.backends.local.backend import LocalBackend
    from tuner.scheduling.controller import SweepController
    from tuner.scheduling.host import SweepHost

#: A notebook's request lapses when its spawner has not asked again for this long (the hub
#: stopped, or the spawn was given up): the GPUs it was owed go back to trials.
REQUEST_TTL_SECONDS = 30.0


@dataclass(frozen=True)
class NotebookAsk:
    """What a spawner asks for: ``gpus`` whole GPUs for ``person``'s server ``server``."""

    person: str
    server: str
    groups: tuple[str, ...]
    gpus: int

    @property
    def request_id(self) -> str:
        return f"notebook:{self.person}/{self.server}"

    @property
    def what(self) -> str:
        return f"notebook {self.person}/{self.server}" if self.server else \
            f"notebook of {self.person}"


@dataclass
class _Waiter:
    ask: NotebookAsk
    since: float  # wall clock of its first ask: its place in line
    seen: float  # monotonic clock of its last ask


@dataclass(frozen=True)
class Victim:
    """A running trial attempt the pool stops, or is stopping, for a notebook."""

    sweep_id: int
    trial: int
    attempt: int
    person: str

    def describe(self) -> str:
        return f"trial {self.trial} of sweep {self.sweep_id} ({self.person})"

    def to_json(self) -> dict[str, Any]:
        return {"sweep_id": self.sweep_id, "trial": self.trial, "attempt": self.attempt,
                "person": self.person}


@dataclass(frozen=True)
class Answer:
    """The pool's answer to a notebook: take the GPUs now (``ready``), or wait at
    ``position`` (1: next) for ``reason``."""

    request_id: str
    ready: bool
    position: int | None
    reason: str
    preempting: tuple[Victim, ...] = ()

    @property
    def message(self) -> str:
        """One line for the spawn page."""
        if self.ready:
            return "a GPU is free for you: starting"
        return f"waiting for a GPU: {ordinal(self.position or 1)} in line, {self.reason}"

    def to_json(self) -> dict[str, Any]:
        return {"request": self.request_id, "ready": self.ready, "position": self.position,
                "reason": self.reason, "message": self.message,
                "preempting": [v.to_json() for v in self.preempting]}


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 21st..."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


@dataclass
class _Picture:
    """One decision's view of the pool."""

    scheduler: Scheduler
    actions: list[Action]
    victims: dict[str, Victim]  # request id of a stoppable trial holding -> who it is
    running: dict[str, SweepController]  # the same ids -> the controller that runs it
    trial_ids: dict[str, int]  # the same ids -> the trial's id
    waiting: dict[str, GpuRequest] = field(default_factory=dict)  # notebooks and trials
    notebooks: dict[str, NotebookAsk] = field(default_factory=dict)  # the waiting notebooks
    started: set[str] = field(default_factory=set)  # waiting requests that may start now


class GpuQueue:
    """The notebooks waiting for this machine's GPUs and the decisions made for them."""

    def __init__(self, host: SweepHost, backend: LocalBackend, lock_dir: Path,
                 shares: ShareConfig | None = None, clock: Callable[[], float] = time.time,
                 ttl: float = REQUEST_TTL_SECONDS) -> None:
        self.host = host
        self.backend = backend
        self.lock_dir = Path(lock_dir)
        self.shares = shares or ShareConfig()
        self.clock = clock
        self.ttl = ttl
        self._waiting: dict[str, _Waiter] = {}
        self._stopping: dict[str, str] = {}  # victim's request id -> the notebook's
        self._unstoppable: set[str] = set()  # trial holdings whose preemption was refused
        self._trials_since: dict[str, float] = {}  # waiting trial -> first seen waiting
        self._lock = asyncio.Lock()
        backend.reserved = self.reserved_gpus

    # --- the spawner's side ----------------------------------------------------------------

    async def ask(self, ask: NotebookAsk) -> Answer:
        """``ask`` waits (or asks again): decide, preempt what the policy says to, answer.
        Decisions are made one at a time, so two notebooks never stop the same trial."""
        async with self._lock:
            rid = ask.request_id
            waiter = self._waiting.get(rid)
            if waiter is None or waiter.ask != ask:
                self._waiting[rid] = _Waiter(ask, self.clock(), time.monotonic())
            else:
                waiter.seen = time.monotonic()
            picture = await self._picture()
            for action in picture.actions:
                if isinstance(action, Preemption) and action.beneficiary.kind == "notebook":
                    await self._preempt(picture, action)
            return self._answer(picture, rid)

    def withdraw(self, person: str, server: str) -> bool:
        """The notebook got its GPUs, or gave up waiting: it no longer waits."""
        rid = NotebookAsk(person, server, (), 1).request_id
        return self._waiting.pop(rid, None) is not None

    def reserved_gpus(self) -> int:
        """GPUs owed to waiting notebooks: trials start only beyond these."""
        self._expire()
        return sum(w.ask.gpus for w in self._waiting.values())

    # --- what everyone sees ----------------------------------------------------------------

    async def view(self) -> dict[str, Any]:
        """The queue in order (position, who, what, why) and each person's share."""
        async with self._lock:
            picture = await self._picture()
        scheduler = picture.scheduler
        queue = []
        for entry in scheduler.queue():
            request = entry.request
            if request.kind == "notebook":
                what = picture.notebooks[request.request_id].what
                reason = self._answer(picture, request.request_id).reason
            else:
                what = f"sweep {request.sweep_id} trial {request.trial_number}"
                reason = entry.reason
            queue.append({"position": entry.position, "person": request.person,
                          "kind": request.kind, "what": what, "gpus": request.gpus,
                          "priority": request.priority if request.kind == "trial" else None,
                          "since": request.enqueued_at, "reason": reason})
        return {"queue": queue, "shares": self._shares(picture)}

    def _shares(self, picture: _Picture) -> list[dict[str, Any]]:
        policy = picture.scheduler.policy
        assert isinstance(policy, FairPolicy)
        held: dict[str, int] = {}
        waiting: dict[str, int] = {}
        requests = {h.request.person: h.request for h in picture.scheduler.holdings.values()}
        for holding in picture.scheduler.holdings.values():
            held[holding.request.person] = held.get(holding.request.person, 0) \
                + len(holding.gpu_ids)
        for request in picture.waiting.values():
            waiting[request.person] = waiting.get(request.person, 0) + request.gpus
            requests.setdefault(request.person, request)
        rows = []
        for person in sorted(requests):
            account = self.shares.account(requests[person])
            cap = self.shares.person(person).max_gpus
            rows.append({"person": person, "account": account, "held_gpus": held.get(person, 0),
                         "waiting_gpus": waiting.get(person, 0),
                         "weight": self.shares.weight(account),
                         "share": policy.share(account),
                         "fair_share_gpus": round(policy.fair_share(account), 3),
                         "max_gpus": cap})
        return rows

    # --- deciding --------------------------------------------------------------------------

    def _expire(self) -> None:
        stale = time.monotonic() - self.ttl
        for rid in [rid for rid, w in self._waiting.items() if w.seen < stale]:
            del self._waiting[rid]

    async def _picture(self) -> _Picture:
        """The pool as the locks show it now, the waiting laid over it, and the decision."""
        self._expire()
        ids = list(self.backend.gpus.gpu_ids)
        rows = await asyncio.to_thread(HolderBook(self.lock_dir).pool, ids)
        scheduler = Scheduler(ids, FairPolicy(self.shares, trials_preempt=False), self.clock)
        picture = _Picture(scheduler, [], {}, {}, {})
        holdings: dict[str, tuple[GpuRequest, list[str]]] = {}
        for row in rows:
            if row["state"] != "held":
                continue
            request = self._holding(picture, row)
            if request.request_id in holdings:
                holdings[request.request_id][1].append(str(row["gpu"]))
            else:
                holdings[request.request_id] = (request, [str(row["gpu"])])
        for rid in list(self._stopping):
            if rid not in holdings:  # it ended: its GPUs are free (or the notebook's)
                del self._stopping[rid]
        self._unstoppable &= set(holdings)
        for request, gpus in sorted(holdings.values(), key=lambda h: h[0].enqueued_at):
            sized = replace(request, gpus=len(gpus))
            scheduler.adopt(sized, gpus, sized.enqueued_at,
                            stopping_for=self._stopping.get(sized.request_id))
        for waiter in sorted(self._waiting.values(), key=lambda w: w.since):
            rid = waiter.ask.request_id
            if rid in scheduler.holdings:
                continue  # its spawner holds the GPUs already
            request = GpuRequest(rid, waiter.ask.person, "notebook", waiter.ask.gpus,
                                 waiter.since, waiter.ask.groups)
            picture.notebooks[rid] = waiter.ask
            self._submit(picture, request)
        for request in self._waiting_trials():
            self._submit(picture, request)
        return picture

    def _submit(self, picture: _Picture, request: GpuRequest) -> None:
        if request.gpus > len(picture.scheduler.gpu_ids):
            return  # never fits; the spawner and the backend's check refuse it
        picture.waiting[request.request_id] = request
        decision = picture.scheduler.submit(request)
        picture.actions.extend(decision.actions)
        picture.started.update(a.holding.request_id for a in decision.actions
                               if isinstance(a, Start))

    def _holding(self, picture: _Picture, row: dict[str, Any]) -> GpuRequest:
        """The request a held GPU's record stands for. A trial is a trial (one that may be
        stopped) only when a controller of this tuner runs that very attempt; anything else
        (a trial of a CLI run, an unreadable record) is held like a notebook: never stopped
        from here."""
        holder = row.get("holder")
        since = float(row.get("since") or self.clock())
        if holder is None:
            return GpuRequest(f"unknown:{row['gpu']}", "unknown", "notebook", 1, since)
        person = str(holder["person"])
        groups = tuple(str(g) for g in holder.get("groups") or ())
        if holder["kind"] != "trial":
            server = str(holder.get("server") or "")
            return GpuRequest(NotebookAsk(person, server, groups, 1).request_id, person,
                              "notebook", 1, since, groups)
        sweep_id, number, attempt = holder.get("sweep_id"), holder.get("trial"), \
            holder.get("attempt")
        rid = f"trial:{sweep_id}/{number}/{attempt}"
        controller = self.host.controllers.get(sweep_id) if isinstance(sweep_id, int) else None
        running = None
        if controller is not None and rid not in self._unstoppable:
            running = next((rt for rt in controller.running
                            if rt.number == number and rt.attempt == attempt), None)
        if controller is None or running is None:
            return GpuRequest(rid, person, "notebook", 1, since, groups)
        picture.victims[rid] = Victim(int(sweep_id), running.number, running.attempt, person)
        picture.running[rid] = controller
        picture.trial_ids[rid] = running.trial_id
        return GpuRequest(rid, person, "trial", 1, since, groups,
                          priority=controller.spec.priority, sweep_id=str(sweep_id),
                          trial_number=running.number)

    def _waiting_trials(self) -> list[GpuRequest]:
        """The trials this tuner's sweeps have waiting for GPUs, each in its place since it
        was first seen waiting (a preempted trial keeps the place it had)."""
        now = self.clock()
        requests, seen = [], set()
        for controller in list(self.host.controllers.values()):
            resources = controller.spec.resources
            for trial_id in controller.waiting_for_gpus():
                number = controller.numbers.get(trial_id, trial_id)
                rid = f"trial:{controller.sweep_id}/{number}"
                seen.add(rid)
                requests.append(GpuRequest(
                    rid, controller.owner, "trial", resources.gpu * resources.workers,
                    self._trials_since.setdefault(rid, now), priority=controller.spec.priority,
                    sweep_id=str(controller.sweep_id), trial_number=number))
        for rid in set(self._trials_since) - seen:
            del self._trials_since[rid]
        return sorted(requests, key=lambda r: r.enqueued_at)

    async def _preempt(self, picture: _Picture, action: Preemption) -> None:
        rid = action.victim.request_id
        controller = picture.running.get(rid)
        victim = picture.victims.get(rid)
        if controller is None or victim is None:
            return
        if await controller.preempt(picture.trial_ids[rid], victim.attempt):
            self._stopping[rid] = action.beneficiary.request_id
        else:  # it ended meanwhile, or cannot be stopped: never chosen again
            self._unstoppable.add(rid)

    def _answer(self, picture: _Picture, rid: str) -> Answer:
        scheduler = picture.scheduler
        if rid in scheduler.holdings or rid in picture.started:
            return Answer(rid, True, None, "a GPU is free")
        request = picture.waiting.get(rid)
        if request is None:
            return Answer(rid, False, None, "it does not wait")
        position = scheduler.policy.position(request)
        victims = tuple(picture.victims[h.request_id] for h in scheduler.stopping_for(rid)
                        if h.request_id in picture.victims)
        cap = scheduler.policy.cap_hit(request)
        if cap is not None:
            reason = cap.reason()
        elif victims:
            reason = "preempting " + ", ".join(v.describe() for v in victims)
        elif position > 1:
            reason = f"behind {position - 1} request(s) that came first"
        else:
            reason = ("no trial can be stopped for it (notebooks, or work this tuner does not "
                      "run, hold the GPUs): it gets the next GPU freed")
        return Answer(rid, False, position, reason, victims)
