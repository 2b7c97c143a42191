"""The GPU pool's queue on one machine: notebooks and trials that wait for GPUs, and the
trials stopped for them.

The GPUs' truth is the lock files (:mod:`tunehub_base.gpus`): who holds what is read from them
at every decision, never kept here. What this keeps is what the locks cannot say: which
notebooks wait (the hub's spawner asks again every second or so while it waits; a request not
asked for :data:`REQUEST_TTL_SECONDS` lapses), which trials are on their way out for whom, and
which sweeps were just let start (until their attempt's lock shows).

Each decision lays the present out for the pool's policy (:class:`tunehub_base.pool.Scheduler`
with :class:`~tunehub_base.pool.FairPolicy`, under the shares and caps of
``TUNEHUB_POOL_SHARES``): the holdings as the locks show them (adopted, a trial being stopped
marked as such, each running trial with its last checkpoint's time read from its directory),
then the waiting notebooks, then the trials this tuner's sweeps have waiting for GPUs. Two
callers ask: a notebook's spawner (:meth:`GpuQueue.ask`), and every sweep controller before it
starts a GPU trial (:meth:`GpuQueue.admits`, the controller's pool gate): a trial starts only
when the policy starts it, so one over its person's cap waits with that reason, and one
outranking a running trial (``priority``, within its account's fair share) has it preempted.
Whatever preemption a decision makes is carried out here, for notebooks and trials alike,
through the victim's sweep controller (SIGTERM, the grace period, SIGKILL; the trial goes back
to the queue, see :meth:`SweepController.preempt`).

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
from tunehub_base.ordinal import ordinal
from tunehub_base.pool import (
    Action,
    FairPolicy,
    GpuRequest,
    Preemption,
    Scheduler,
    ShareConfig,
    Start,
)
from tunehub_base.pool.shares_setting import SharesSource
from tuner.scheduling.checkpoint_age import last_checkpoint_at

if TYPE_CHECKING:
    from tuner.backends.local.backend import LocalBackend
    from tuner.scheduling.controller import SweepController
    from tuner.scheduling.host import SweepHost
    from tuner.scheduling.hub_groups import HubGroups

#: A notebook's request lapses when its spawner has not asked again for this long (the hub
#: stopped, or the spawn was given up): the GPUs it was owed go back to trials.
REQUEST_TTL_SECONDS = 30.0
#: A sweep let start a trial holds its place on the GPUs this long at most, until its
#: attempt's lock shows (its controller starts it within the same moment, or not at all).
ADMISSION_TTL_SECONDS = 10.0
#: The trial number a sweep's next trial stands under before it is asked from the sampler.
NEXT_TRIAL = -1


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
    heads: dict[int, str] = field(default_factory=dict)  # sweep id -> its first waiting trial


@dataclass
class _Admission:
    """A sweep let start a trial on ``gpus`` GPUs while it had ``running`` attempts: it holds
    them in every decision until it runs more attempts (its lock then shows) or it expires."""

    gpus: int
    running: int
    expires: float  # monotonic


def trial_request_id(sweep_id: int, number: int) -> str:
    """A waiting trial's request id (``NEXT_TRIAL``: the sweep's next, not asked yet)."""
    return f"trial:{sweep_id}/{'next' if number == NEXT_TRIAL else number}"


class GpuQueue:
    """The notebooks and trials waiting for this machine's GPUs, and the decisions made for
    them."""

    def __init__(self, host: SweepHost, backend: LocalBackend, lock_dir: Path,
                 shares: ShareConfig | SharesSource | None = None,
                 clock: Callable[[], float] = time.time,
                 ttl: float = REQUEST_TTL_SECONDS,
                 hub_groups: HubGroups | None = None) -> None:
        """``shares``: the weights and caps, fixed or from the setting (default: read from
        ``TUNEHUB_POOL_SHARES``, a file re-read when it changes). ``hub_groups``: which
        configured hub groups a sweep's owner belongs to, so a team's quota counts its trials
        as it counts its notebooks (None: no hub, everyone counts as a person only)."""
        self.host = host
        self.backend = backend
        self.lock_dir = Path(lock_dir)
        self.source = shares if isinstance(shares, SharesSource) else None
        self._fixed = shares if isinstance(shares, ShareConfig) else None
        if self.source is None and self._fixed is None:
            self.source = SharesSource()
        self.clock = clock
        self.ttl = ttl
        self.hub_groups = hub_groups
        self._waiting: dict[str, _Waiter] = {}
        self._stopping: dict[str, str] = {}  # victim's request id -> the request it frees for
        self._unstoppable: set[str] = set()  # trial holdings whose preemption was refused
        self._trials_since: dict[str, float] = {}  # waiting trial -> first seen waiting
        self._admitted: dict[int, _Admission] = {}  # sweep id -> its start, until it shows
        self._tasks: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()
        backend.reserved = self.reserved_gpus
        backend.groups_of = self.groups_of
        host.pool_gate = self

    @property
    def shares(self) -> ShareConfig:
        """The weights and caps in force now."""
        if self._fixed is not None:
            return self._fixed
        assert self.source is not None
        return self.source.current()

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
            stops = self._carry_out(picture)
            if stops:
                await asyncio.wait(stops)
            return self._answer(picture, rid)

    def withdraw(self, person: str, server: str) -> bool:
        """The notebook got its GPUs, or gave up waiting: it no longer waits."""
        rid = NotebookAsk(person, server, (), 1).request_id
        return self._waiting.pop(rid, None) is not None

    def reserved_gpus(self) -> int:
        """GPUs owed to waiting notebooks: trials start only beyond these."""
        self._expire()
        return sum(w.ask.gpus for w in self._waiting.values())

    # --- the controllers' side -------------------------------------------------------------

    def admits(self, controller: SweepController) -> tuple[bool, str | None]:
        """May ``controller`` start its next trial now, as the pool's policy orders everyone
        waiting? ``(True, None)``, or ``(False, reason)`` where ``reason`` is what its waiting
        trial's row should say (a cap it is over), else None (the pool is full: the queue
        says where it stands). A preemption the decision makes, for it or for anyone, is set
        going. Synchronous, on the event loop: the lock records are a few small files."""
        if not controller.spec.resources.gpu or controller.backend is not self.backend:
            return True, None
        sweep_id = controller.sweep_id
        admission = self._admitted.get(sweep_id)
        if admission is not None and self._live(controller, admission):
            return True, None
        rows = HolderBook(self.lock_dir).pool(list(self.backend.gpus.gpu_ids))
        picture = self._decide(rows)
        self._carry_out(picture)
        rid = picture.heads.get(sweep_id)
        if rid is None:
            return False, None  # nothing of it waits (no slot free, or too large for the pool)
        if rid in picture.started:
            request = picture.waiting[rid]
            self._admitted[sweep_id] = _Admission(request.gpus, len(controller.running),
                                                  time.monotonic() + ADMISSION_TTL_SECONDS)
            return True, None
        cap = picture.scheduler.policy.cap_hit(picture.waiting[rid])
        return False, (f"waiting for a GPU: {cap.reason()}" if cap is not None else None)

    def _live(self, controller: SweepController, admission: _Admission) -> bool:
        if len(controller.running) > admission.running or time.monotonic() > admission.expires:
            del self._admitted[controller.sweep_id]
            return False
        return True

    def groups_of(self, person: str) -> tuple[str, ...]:
        """The configured hub groups a sweep's owner is a member of."""
        return self.hub_groups.of(person) if self.hub_groups is not None else ()

    # --- what everyone sees ----------------------------------------------------------------

    async def view(self, wait: bool = True) -> dict[str, Any]:
        """The queue in order (position, who, what, why), each person's share, weight and cap
        (everyone holding, waiting or named in the shares), and the configured groups.
        ``wait=False`` (a scrape): do not wait for a decision under way (a notebook's ask holds
        the lock while its preemption runs, up to the grace period); the picture is made
        between decisions on the event loop, as :meth:`admits` makes its own."""
        if wait:
            async with self._lock:
                picture = await self._picture()
        else:
            picture = await self._picture()
        scheduler = picture.scheduler
        queue = []
        for entry in scheduler.queue():
            request = entry.request
            if request.kind == "notebook":
                what = picture.notebooks[request.request_id].what
                reason = self._answer(picture, request.request_id).reason
            else:
                what = (f"sweep {request.sweep_id} next trial"
                        if request.trial_number == NEXT_TRIAL
                        else f"sweep {request.sweep_id} trial {request.trial_number}")
                reason = self._trial_reason(picture, request, entry.reason)
            queue.append({"position": entry.position, "person": request.person,
                          "kind": request.kind, "what": what, "gpus": request.gpus,
                          "priority": request.priority if request.kind == "trial" else None,
                          "since": request.enqueued_at, "reason": reason})
        shares = self.shares
        view: dict[str, Any] = {"queue": queue, "shares": self._shares(picture, shares),
                                "groups": self._groups(picture, shares)}
        if self.source is not None and self.source.error is not None:
            view["shares_error"] = self.source.error
        return view

    async def places(self, sweep_id: int) -> dict[int, str]:
        """Each of sweep ``sweep_id``'s trials waiting for a GPU (trial number -> what its row
        says), from the same decision the pool view shows: its place in line and why, e.g.
        "waiting for a GPU: 2nd in line behind ann's notebook", or the cap it is over. Read
        without waiting for a decision under way (see :meth:`view`): a trials page must not
        hang for a preemption's grace period."""
        picture = await self._picture()
        entries = picture.scheduler.queue()
        places: dict[int, str] = {}
        for i, entry in enumerate(entries):
            request = entry.request
            if (request.kind != "trial" or request.sweep_id != str(sweep_id)
                    or request.trial_number in (None, NEXT_TRIAL)):
                continue
            assert request.trial_number is not None
            places[request.trial_number] = "waiting for a GPU: " + self._place(
                picture, request, entry.position, entries[i - 1].request if i else None)
        return places

    def _place(self, picture: _Picture, request: GpuRequest, position: int,
               ahead: GpuRequest | None) -> str:
        """A waiting trial's place and why: a cap, a preemption under way, or who is ahead."""
        cap = picture.scheduler.policy.cap_hit(request)
        if cap is not None:
            return cap.reason()
        reason = self._trial_reason(picture, request, "")
        if reason:
            return f"{ordinal(position)} in line, {reason}"
        if ahead is None:
            return f"{ordinal(position)} in line, for the next GPU freed"
        return f"{ordinal(position)} in line behind {self._whose(picture, ahead)}"

    @staticmethod
    def _whose(picture: _Picture, request: GpuRequest) -> str:
        """A waiting request as its neighbour's row names it ("ann's notebook")."""
        if request.kind == "notebook":
            ask = picture.notebooks.get(request.request_id)
            server = f" {ask.server}" if ask is not None and ask.server else ""
            return f"{request.person}'s notebook{server}"
        if request.trial_number in (None, NEXT_TRIAL):
            return f"{request.person}'s sweep {request.sweep_id}"
        return f"{request.person}'s trial {request.trial_number} of sweep {request.sweep_id}"

    def _trial_reason(self, picture: _Picture, request: GpuRequest, reason: str) -> str:
        victims = [picture.victims[h.request_id]
                   for h in picture.scheduler.stopping_for(request.request_id)
                   if h.request_id in picture.victims]
        if victims and picture.scheduler.policy.cap_hit(request) is None:
            return "preempting " + ", ".join(v.describe() for v in victims)
        return reason

    def _shares(self, picture: _Picture, shares: ShareConfig) -> list[dict[str, Any]]:
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
        for person in shares.people:
            requests.setdefault(person, GpuRequest(f"named:{person}", person, "notebook", 1, 0))
        rows = []
        for person in sorted(requests):
            if person == "unknown" and person not in shares.people:
                continue  # an unreadable holder record, not a person
            account = shares.account(requests[person])
            rows.append({"person": person, "account": account, "held_gpus": held.get(person, 0),
                         "waiting_gpus": waiting.get(person, 0),
                         "weight": shares.weight(account),
                         "share": policy.share(account),
                         "fair_share_gpus": round(policy.fair_share(account), 3),
                         "max_gpus": shares.person(person).max_gpus})
        return rows

    def _groups(self, picture: _Picture, shares: ShareConfig) -> list[dict[str, Any]]:
        policy = picture.scheduler.policy
        hub = self.hub_groups
        return [{"group": name, "weight": share.weight, "max_gpus": share.max_gpus,
                 "held_gpus": policy.held_by_group[name],
                 "members": hub.members(name) if hub is not None else None}
                for name, share in sorted(shares.groups.items())]

    # --- deciding --------------------------------------------------------------------------

    def _expire(self) -> None:
        stale = time.monotonic() - self.ttl
        for rid in [rid for rid, w in self._waiting.items() if w.seen < stale]:
            del self._waiting[rid]

    async def _picture(self) -> _Picture:
        """The pool as the locks show it now, the waiting laid over it, and the decision."""
        self._expire()
        rows = await asyncio.to_thread(HolderBook(self.lock_dir).pool,
                                       list(self.backend.gpus.gpu_ids))
        return self._decide(rows)

    def _decide(self, rows: list[dict[str, Any]]) -> _Picture:
        """The decision for the pool as ``rows`` (the lock records) show it."""
        self._expire()
        ids = list(self.backend.gpus.gpu_ids)
        shares = self.shares
        scheduler = Scheduler(ids, FairPolicy(shares), self.clock)
        picture = _Picture(scheduler, [], {}, {}, {})
        holdings: dict[str, tuple[GpuRequest, list[str], float]] = {}
        for row in rows:
            if row["state"] != "held":
                continue
            request, saved = self._holding(picture, row)
            if request.request_id in holdings:
                holdings[request.request_id][1].append(str(row["gpu"]))
            else:
                holdings[request.request_id] = (request, [str(row["gpu"])], saved)
        for rid in list(self._stopping):
            if rid not in holdings:  # it ended: its GPUs are free (or the beneficiary's)
                del self._stopping[rid]
        self._unstoppable &= set(holdings)
        for request, gpus, saved in sorted(holdings.values(), key=lambda h: h[0].enqueued_at):
            sized = replace(request, gpus=len(gpus))
            scheduler.adopt(sized, gpus, sized.enqueued_at, last_checkpoint_at=saved,
                            stopping_for=self._stopping.get(sized.request_id))
        admitted = self._adopt_admissions(scheduler)
        for waiter in sorted(self._waiting.values(), key=lambda w: w.since):
            rid = waiter.ask.request_id
            if rid in scheduler.holdings:
                continue  # its spawner holds the GPUs already
            picture.notebooks[rid] = waiter.ask
            self._wait(picture, GpuRequest(rid, waiter.ask.person, "notebook",
                                           waiter.ask.gpus, waiter.since, waiter.ask.groups))
        for request in self._waiting_trials(admitted):
            assert request.sweep_id is not None
            picture.heads.setdefault(int(request.sweep_id), request.request_id)
            self._wait(picture, request)
        # Everyone in the queue first, then one pass: the policy's order decides who starts.
        picture.actions = scheduler.submit_all(list(picture.waiting.values()))
        picture.started = {a.holding.request_id for a in picture.actions if isinstance(a, Start)}
        return picture

    def _adopt_admissions(self, scheduler: Scheduler) -> set[int]:
        """Sweeps let start a trial whose lock does not show yet hold their GPUs (any free
        ones) in this decision, so nobody else is let start on them meanwhile."""
        admitted = set()
        for sweep_id, admission in list(self._admitted.items()):
            controller = self.host.controllers.get(sweep_id)
            if controller is None or not self._live(controller, admission):
                self._admitted.pop(sweep_id, None)
                continue
            free = [g for g in scheduler.gpu_ids if g not in {
                gpu for h in scheduler.holdings.values() for gpu in h.gpu_ids}]
            if len(free) < admission.gpus:
                continue  # its lock is there already, under its attempt
            request = GpuRequest(f"admitted:{sweep_id}", controller.owner, "notebook",
                                 admission.gpus, self.clock(),
                                 self.groups_of(controller.owner))
            scheduler.adopt(request, free[:admission.gpus], request.enqueued_at)
            admitted.add(sweep_id)
        return admitted

    @staticmethod
    def _wait(picture: _Picture, request: GpuRequest) -> None:
        if request.gpus > len(picture.scheduler.gpu_ids):
            return  # never fits; the spawner and the backend's check refuse it
        picture.waiting[request.request_id] = request

    def _holding(self, picture: _Picture, row: dict[str, Any]) -> tuple[GpuRequest, float]:
        """The request a held GPU's record stands for, and when it last saved a checkpoint. A
        trial is a trial (one that may be stopped) only when a controller of this tuner runs
        that very attempt; anything else (a trial of a CLI run, an unreadable record) is held
        like a notebook: never stopped from here."""
        holder = row.get("holder")
        since = float(row.get("since") or self.clock())
        if holder is None:
            return GpuRequest(f"unknown:{row['gpu']}", "unknown", "notebook", 1, since), since
        person = str(holder["person"])
        groups = tuple(str(g) for g in holder.get("groups") or ())
        if holder["kind"] != "trial":
            server = str(holder.get("server") or "")
            return GpuRequest(NotebookAsk(person, server, groups, 1).request_id, person,
                              "notebook", 1, since, groups), since
        groups = self.groups_of(person)  # the hub's now (the record's: at its start)
        sweep_id, number, attempt = holder.get("sweep_id"), holder.get("trial"), \
            holder.get("attempt")
        rid = f"trial:{sweep_id}/{number}/{attempt}"
        controller = self.host.controllers.get(sweep_id) if isinstance(sweep_id, int) else None
        running = None
        if controller is not None and rid not in self._unstoppable:
            running = next((rt for rt in controller.running
                            if rt.number == number and rt.attempt == attempt), None)
        if controller is None or running is None:
            return GpuRequest(rid, person, "notebook", 1, since, groups), since
        picture.victims[rid] = Victim(int(sweep_id), running.number, running.attempt, person)
        picture.running[rid] = controller
        picture.trial_ids[rid] = running.trial_id
        saved = last_checkpoint_at(running.paths.checkpoint_dir) or since
        return GpuRequest(rid, person, "trial", 1, since, groups,
                          priority=controller.spec.priority, sweep_id=str(sweep_id),
                          trial_number=running.number), saved

    def _waiting_trials(self, admitted: set[int]) -> list[GpuRequest]:
        """The trials this tuner's sweeps have waiting for GPUs, each in its place since it
        was first seen waiting (a preempted trial keeps the place it had; a sweep with a free
        slot and trials left but none asked yet waits as its "next trial"). A sweep just let
        start a trial has that one among the holdings instead."""
        now = self.clock()
        requests: list[GpuRequest] = []
        seen: set[str] = set()
        for controller in list(self.host.controllers.values()):
            sweep_id = controller.sweep_id
            seen.update(trial_request_id(sweep_id, rt.number) for rt in controller.running)
            if controller.backend is not self.backend or not self.host.admits(
                    controller.owner, controller.spec.resources.workers):
                continue  # (over its owner's worker cap: it waits for that, not for a GPU)
            numbers = [controller.numbers.get(t, t) for t in controller.waiting_for_gpus()]
            if not numbers and self._may_ask(controller):
                numbers = [NEXT_TRIAL]
            if sweep_id in admitted:
                numbers = numbers[1:]
            resources = controller.spec.resources
            for number in numbers:
                rid = trial_request_id(sweep_id, number)
                seen.add(rid)
                since = self._trials_since.get(rid)
                if since is None:  # the next trial, once asked, keeps the sweep's place
                    since = self._trials_since.get(trial_request_id(sweep_id, NEXT_TRIAL), now)
                    self._trials_since[rid] = since
                requests.append(GpuRequest(
                    rid, controller.owner, "trial", resources.gpu * resources.workers, since,
                    self.groups_of(controller.owner), priority=controller.spec.priority,
                    sweep_id=str(sweep_id), trial_number=number))
        for rid in set(self._trials_since) - seen:
            del self._trials_since[rid]
        return sorted(requests, key=lambda r: r.enqueued_at)

    @staticmethod
    def _may_ask(controller: SweepController) -> bool:
        """The sweep would ask a new GPU trial now if the pool had room."""
        return (bool(controller.spec.resources.gpu) and not controller.cancel_requested
                and controller.asking is None and controller.ready is None
                and not controller.relaunch
                and controller.created < controller.spec.trials
                and len(controller.running) < controller.spec.parallelism)

    def _carry_out(self, picture: _Picture) -> list[asyncio.Task[None]]:
        """Set going every preemption the decision made (a trial not asked yet waits for its
        next decision, once it has a number); each victim is marked at once, so no later
        decision stops a second trial for the same request."""
        tasks = []
        for action in picture.actions:
            if not isinstance(action, Preemption):
                continue
            beneficiary = action.beneficiary
            if beneficiary.kind == "trial" and beneficiary.trial_number == NEXT_TRIAL:
                continue
            rid = action.victim.request_id
            controller = picture.running.get(rid)
            victim = picture.victims.get(rid)
            if controller is None or victim is None or rid in self._stopping:
                continue
            self._stopping[rid] = beneficiary.request_id
            task = asyncio.get_running_loop().create_task(
                self._preempt(controller, picture.trial_ids[rid], victim, rid))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            tasks.append(task)
        return tasks

    async def _preempt(self, controller: SweepController, trial_id: int, victim: Victim,
                       rid: str) -> None:
        if not await controller.preempt(trial_id, victim.attempt):
            # It ended meanwhile, or cannot be stopped: never chosen again.
            self._stopping.pop(rid, None)
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
