"""The product's policy: notebooks first, then sweeps by priority and by share, and sweeps yield.

Order of the queue: every notebook before every trial; trials by ``priority`` (high, normal,
low); within one tier, the account (person, or the hub group whose quota they share; see
:mod:`~tunehub_base.pool.shares`) with the lowest dominant share (GPUs held / weight) first; then
first come, first served. A request over its person's or group's cap waits with that reason and
does not hold up the others.

Who yields: when a notebook cannot fit, or a trial cannot fit that outranks some running trial
and whose account would still be within its fair share (pool × weight / active weights), running
trials are stopped: the lowest priority first, then the account furthest over its share, then
the trial that loses least (the most recent checkpoint). A notebook is never stopped.

Every ordering is a :class:`~tunehub_base.pool.keyed_heap.KeyedHeap` updated when a share
changes, and a waiting request's position is read from two
:class:`~tunehub_base.pool.ranked.RankedKeys` (its tier's accounts weighted by their waiting
requests, and its lane's requests by arrival) kept up to date alongside, so a decision (submit,
schedule, release, a position) costs O(log n) however large the pool.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from tunehub_base.pool._base import Policy
from tunehub_base.pool.keyed_heap import KeyedHeap
from tunehub_base.pool.ranked import RankedKeys
from tunehub_base.pool.request import NOTEBOOK_TIER, GpuRequest, Holding
from tunehub_base.pool.shares import ShareConfig

_Entry = tuple[float, int, str]  # (enqueued_at, arrival sequence, request id)
_RankKey = tuple[float, float, int, str]  # (share, oldest entry's time and seq, account)


@dataclass
class _Lane:
    """One account's waiting requests in one tier: a FIFO per person, people by their oldest."""

    people: KeyedHeap[str] = field(default_factory=KeyedHeap)
    fifo: dict[str, list[_Entry]] = field(default_factory=dict)
    requests: dict[str, GpuRequest] = field(default_factory=dict)
    blocked: set[str] = field(default_factory=set)  # people a cap holds back
    #: Every waiting request's entry in arrival order, for the oldest and for positions.
    live: RankedKeys[_Entry] = field(default_factory=RankedKeys)
    entries: dict[str, _Entry] = field(default_factory=dict)

    def head_entry(self, person: str) -> _Entry | None:
        """The oldest request of ``person`` still waiting (withdrawn ones are dropped)."""
        queue = self.fifo.get(person)
        while queue:
            if queue[0][2] in self.requests:
                return queue[0]
            heapq.heappop(queue)
        self.fifo.pop(person, None)
        return None


@dataclass
class _Tier:
    accounts: KeyedHeap[str] = field(default_factory=KeyedHeap)  # by (share, oldest head)
    lanes: dict[str, _Lane] = field(default_factory=dict)
    waiting: Counter[str] = field(default_factory=Counter)  # per account
    total_waiting: int = 0
    #: Accounts with requests waiting, in the order of the queue (share, oldest request,
    #: name), each weighted by its waiting requests: what a position counts ahead.
    ranked: RankedKeys[_RankKey] = field(default_factory=RankedKeys)
    rank_of: dict[str, tuple[_RankKey, int]] = field(default_factory=dict)


class FairPolicy(Policy):
    """Notebooks first; trials by priority, dominant share, FIFO; preemption of the cheapest."""

    name = "fair"

    def __init__(self, shares: ShareConfig | None = None, trials_preempt: bool = True) -> None:
        """``trials_preempt``: a waiting trial may stop running trials of a lower priority
        (within its fair share); off where only notebooks' preemptions are carried out, so
        the queue never shows a trial waiting on a stop that will not come (the local tuner
        carries out both: :mod:`tuner.scheduling.gpu_queue`)."""
        super().__init__(shares)
        self.trials_preempt = trials_preempt
        self._tiers = [_Tier() for _ in range(NOTEBOOK_TIER + 1)]
        #: Running trials that may be stopped, per tier: accounts by share (highest first),
        #: and each account's trials by last checkpoint (most recent first).
        self._victim_accounts = [KeyedHeap[str]() for _ in range(NOTEBOOK_TIER)]
        self._running: list[dict[str, KeyedHeap[str]]] = [{} for _ in range(NOTEBOOK_TIER)]
        self._holdings: dict[str, Holding] = {}
        self._held_by_account: Counter[str] = Counter()  # GPUs held, not counting stopping
        self._blocked: defaultdict[str, set[tuple[int, str, str]]] = defaultdict(set)
        self._presence: Counter[str] = Counter()  # waiting + holding requests per account
        self._active_weight = 0.0
        self._seq = 0

    # -- shares ----------------------------------------------------------------------------

    def share(self, account: str) -> float:
        """Dominant share: GPUs the account holds (not counting those stopping) / weight."""
        return self._held_by_account[account] / self.shares.weight(account)

    def fair_share(self, account: str) -> float:
        """GPUs the account is entitled to among the accounts present now."""
        active = self._active_weight or self.shares.weight(account)
        return self.total_gpus * self.shares.weight(account) / active

    def _present(self, account: str, delta: int) -> None:
        before = self._presence[account]
        self._presence[account] += delta
        if before == 0 and delta > 0:
            self._active_weight += self.shares.weight(account)
        elif self._presence[account] == 0:
            del self._presence[account]
            self._active_weight = max(0.0, self._active_weight - self.shares.weight(account))

    # -- the queue -------------------------------------------------------------------------

    def enqueue(self, request: GpuRequest) -> None:
        account = self.shares.account(request)
        tier = self._tiers[request.tier]
        lane = tier.lanes.setdefault(account, _Lane())
        self._seq += 1
        entry = (request.enqueued_at, self._seq, request.request_id)
        heapq.heappush(lane.fifo.setdefault(request.person, []), entry)
        lane.requests[request.request_id] = request
        lane.live.add(entry)
        lane.entries[request.request_id] = entry
        tier.waiting[account] += 1
        tier.total_waiting += 1
        self._present(account, +1)
        self._refresh_person(request.tier, account, request.person)
        self._refresh_account(request.tier, account)

    def withdraw(self, request: GpuRequest) -> None:
        self._leave_queue(request)

    def head(self) -> GpuRequest | None:
        for tier_index in range(NOTEBOOK_TIER, -1, -1):
            tier = self._tiers[tier_index]
            while (account := tier.accounts.peek()) is not None:
                lane = tier.lanes[account]
                person = lane.people.peek()
                entry = lane.head_entry(person) if person is not None else None
                if person is None or entry is None:
                    self._refresh_account(tier_index, account)
                    continue
                request = lane.requests[entry[2]]
                cap = self.cap_hit(request)
                if cap is None:
                    return request
                lane.people.discard(person)
                lane.blocked.add(person)
                self._blocked[cap.entity].add((tier_index, account, person))
                self._refresh_account(tier_index, account)
        return None

    def _leave_queue(self, request: GpuRequest) -> str:
        account = self.shares.account(request)
        tier = self._tiers[request.tier]
        lane = tier.lanes[account]
        del lane.requests[request.request_id]
        lane.live.remove(lane.entries.pop(request.request_id))
        tier.waiting[account] -= 1
        if not tier.waiting[account]:
            del tier.waiting[account]
        tier.total_waiting -= 1
        self._present(account, -1)
        self._refresh_person(request.tier, account, request.person)
        self._refresh_account(request.tier, account)
        return account

    def _refresh_person(self, tier_index: int, account: str, person: str) -> None:
        lane = self._tiers[tier_index].lanes.get(account)
        if lane is None:
            return
        entry = lane.head_entry(person)
        if entry is None:
            lane.people.discard(person)
            lane.blocked.discard(person)
        elif person not in lane.blocked:
            lane.people.set(person, (entry[0], entry[1]))

    def _refresh_account(self, tier_index: int, account: str) -> None:
        tier = self._tiers[tier_index]
        lane = tier.lanes.get(account)
        if lane is None:
            return
        share = self.share(account)
        self._rank(tier, account, lane, share)
        person = lane.people.peek()
        if person is None:
            tier.accounts.discard(account)
            if not lane.requests:
                del tier.lanes[account]
            return
        tier.accounts.set(account, (share, *lane.people.key(person)))

    def _rank(self, tier: _Tier, account: str, lane: _Lane, share: float) -> None:
        """Keep ``account``'s key and weight in ``tier.ranked`` current (its share, its oldest
        waiting request or its number waiting changed; it leaves with its last request)."""
        old = tier.rank_of.get(account)
        oldest = lane.live.first()
        if oldest is None:
            if old is not None:
                tier.ranked.remove(old[0])
                del tier.rank_of[account]
            return
        waiting = len(lane.live)
        key = (share, oldest[0], oldest[1], account)
        if old is not None:
            if old[0] == key:
                if old[1] != waiting:
                    tier.ranked.reweight(key, waiting - old[1])
                    tier.rank_of[account] = (key, waiting)
                return
            tier.ranked.remove(old[0])
        tier.ranked.add(key, waiting)
        tier.rank_of[account] = (key, waiting)

    def _touch(self, account: str) -> None:
        """The account's share changed: re-key it wherever it is ordered."""
        for tier_index, tier in enumerate(self._tiers):
            if account in tier.lanes:
                self._refresh_account(tier_index, account)
        for tier_index, running in enumerate(self._running):
            if running.get(account):
                self._victim_accounts[tier_index].set(account, -self.share(account))

    # -- holdings --------------------------------------------------------------------------

    def started(self, holding: Holding) -> None:
        request = holding.request
        account = self._leave_queue(request)
        self._present(account, +1)
        self.count(holding, +1)
        self._holdings[request.request_id] = holding
        self._held_by_account[account] += request.gpus
        if request.kind == "trial":
            running = self._running[request.tier].setdefault(account, KeyedHeap())
            running.set(request.request_id, -holding.last_checkpoint_at)
        self._touch(account)

    def stopping(self, holding: Holding) -> None:
        request = holding.request
        account = self.shares.account(request)
        self._running[request.tier].get(account, KeyedHeap()).discard(request.request_id)
        self._held_by_account[account] -= request.gpus
        self._touch(account)

    def checkpointed(self, holding: Holding) -> None:
        request = holding.request
        if request.kind != "trial" or holding.stopping:
            return
        running = self._running[request.tier].get(self.shares.account(request))
        if running is not None and request.request_id in running:
            running.set(request.request_id, -holding.last_checkpoint_at)

    def ended(self, holding: Holding) -> None:
        request = holding.request
        account = self.shares.account(request)
        del self._holdings[request.request_id]
        if not holding.stopping:
            if request.kind == "trial":
                self._running[request.tier].get(account, KeyedHeap()).discard(request.request_id)
            self._held_by_account[account] -= request.gpus
        if request.kind == "trial" and not self._running[request.tier].get(account):
            self._running[request.tier].pop(account, None)
            self._victim_accounts[request.tier].discard(account)
        self.count(holding, -1)
        self._present(account, -1)
        for entity in (f"person:{request.person}", *(f"group:{g}" for g in request.groups)):
            for tier_index, blocked_account, person in self._blocked.pop(entity, ()):
                lane = self._tiers[tier_index].lanes.get(blocked_account)
                if lane is not None and person in lane.blocked:
                    lane.blocked.discard(person)
                    self._refresh_person(tier_index, blocked_account, person)
                    self._refresh_account(tier_index, blocked_account)
        self._touch(account)

    # -- preemption ------------------------------------------------------------------------

    def victims(self, request: GpuRequest, need: int, now: float) -> list[Holding]:
        if request.kind == "notebook":
            tiers = range(NOTEBOOK_TIER)
        elif not self.trials_preempt:
            return []
        else:
            account = self.shares.account(request)
            if self._held_by_account[account] + request.gpus > self.fair_share(account):
                return []
            tiers = range(request.tier)
        chosen: list[Holding] = []
        freed = 0
        for tier_index in tiers:
            accounts = self._victim_accounts[tier_index]
            while freed < need and (victim_account := accounts.peek()) is not None:
                running = self._running[tier_index].get(victim_account)
                rid = running.pop() if running else None
                if rid is None:
                    accounts.discard(victim_account)
                    continue
                holding = self._holdings[rid]
                chosen.append(holding)
                freed += holding.request.gpus
                # Until it is confirmed, count the victim as gone for the next pick.
                self._held_by_account[victim_account] -= holding.request.gpus
                self._touch(victim_account)
            if freed >= need:
                break
        for holding in chosen:  # the scheduler's stopping() makes it final
            victim_account = self.shares.account(holding.request)
            self._held_by_account[victim_account] += holding.request.gpus
            if freed < need:  # not enough to stop: nobody is stopped
                self._running[holding.request.tier][victim_account].set(
                    holding.request_id, -holding.last_checkpoint_at)
            self._touch(victim_account)
        return chosen if freed >= need else []

    # -- views -----------------------------------------------------------------------------

    def ordered_waiting(self) -> list[GpuRequest]:
        """Tier by tier, accounts by (share, oldest waiting request, name), each account's
        requests by arrival."""
        out: list[GpuRequest] = []
        for tier_index in range(NOTEBOOK_TIER, -1, -1):
            tier = self._tiers[tier_index]
            for key in tier.ranked:
                lane = tier.lanes[key[3]]
                out.extend(lane.requests[e[2]] for e in lane.live)
        return out

    def position(self, request: GpuRequest) -> int:
        """Those waiting in the tiers above (counters), the waiting requests of the accounts
        ordered before ``request``'s in its tier, and its account's requests enqueued
        strictly earlier: O(log n), two :meth:`RankedKeys.weight_below` calls."""
        ahead = sum(t.total_waiting for t in self._tiers[request.tier + 1:])
        tier = self._tiers[request.tier]
        account = self.shares.account(request)
        ahead += tier.ranked.weight_below(tier.rank_of[account][0])
        # Entries are (enqueued_at, seq >= 1, id): those below (t, -1, "") came before t.
        ahead += tier.lanes[account].live.weight_below((request.enqueued_at, -1, ""))
        return ahead + 1
