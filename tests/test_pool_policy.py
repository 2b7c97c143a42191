"""The GPU pool's policy (``tunehub_base/pool``) as pure decisions on a fake clock: who starts,
who waits where and why, whom a notebook preempts, and what the accounting adds up to."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from tunehub_base.pool import (
    FairPolicy,
    FirstComePolicy,
    GpuRequest,
    PartitionedPolicy,
    Preemption,
    Scheduler,
    ShareConfig,
    Start,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


_ids = itertools.count()


def trial(person: str, sweep: str = "s", priority: str = "normal", gpus: int = 1,
          groups: tuple[str, ...] = (), at: float = 0.0) -> GpuRequest:
    n = next(_ids)
    return GpuRequest(f"{sweep}-{n}", person, "trial", gpus, at, groups, priority,
                      sweep_id=sweep, trial_number=n)


def notebook(person: str, gpus: int = 1, at: float = 0.0,
             groups: tuple[str, ...] = ()) -> GpuRequest:
    return GpuRequest(f"nb-{person}-{next(_ids)}", person, "notebook", gpus, at, groups)


def pool(n: int, shares: dict[str, Any] | None = None) -> tuple[Scheduler, Clock]:
    clock = Clock()
    policy = FairPolicy(ShareConfig.from_dict(shares))
    return Scheduler([str(i) for i in range(n)], policy, clock), clock


def test_a_notebook_on_a_full_pool_preempts_the_trial_that_loses_least() -> None:
    sched, clock = pool(3)
    held = [sched.submit(trial("ann", "a")).holding for _ in range(3)]
    clock.now = 1000.0
    sched.checkpointed(held[0].request_id, at=700.0)  # type: ignore[union-attr]
    sched.checkpointed(held[1].request_id, at=950.0)  # type: ignore[union-attr]
    decision = sched.submit(notebook("bob", at=clock.now))
    assert not decision.started
    assert decision.reason == "waiting: a trial is stopping to free its GPUs for you"
    [stop] = decision.actions
    assert isinstance(stop, Preemption)
    assert stop.victim is held[1] and stop.checkpoint_age == 50.0
    clock.now = 1010.0  # its grace period
    released = sched.release(stop.victim.request_id)
    [start] = sched.schedule()
    assert isinstance(start, Start) and start.holding.request == decision.request
    assert start.holding.gpu_ids == stop.victim.gpu_ids
    assert released.lost_seconds == 60.0  # since its last checkpoint, grace included


def test_a_notebook_is_never_preempted() -> None:
    sched, clock = pool(2)
    sched.submit(notebook("ann"))
    sched.submit(notebook("bob"))
    decision = sched.submit(notebook("cid"))
    assert not decision.actions and decision.position == 1
    assert decision.reason == "waiting: pool full; 0 ahead"
    assert not sched.submit(trial("dan", priority="high")).actions


def test_lowest_priority_is_preempted_first_and_only_for_more_urgent_work() -> None:
    sched, _ = pool(3)
    high = sched.submit(trial("ann", "h", "high")).holding
    low = sched.submit(trial("bob", "l", "low")).holding
    normal = sched.submit(trial("cid", "n", "normal")).holding
    assert high and low and normal
    stop = sched.submit(notebook("dan")).actions[0]
    assert isinstance(stop, Preemption) and stop.victim is low
    # A normal trial from someone under their share preempts nothing that is not lower.
    sched2, _ = pool(2)
    sched2.submit(trial("ann", "n1"))
    sched2.submit(trial("ann", "n2"))
    assert not sched2.submit(trial("bob", "n3")).actions
    sched3, _ = pool(2)
    lows = [sched3.submit(trial("ann", "l", "low")).holding for _ in range(2)]
    [stop] = sched3.submit(trial("bob", "h", "high")).actions
    assert isinstance(stop, Preemption) and stop.victim in lows


def test_waiting_trials_start_by_priority_then_first_come() -> None:
    sched, _ = pool(1)
    first = sched.submit(trial("ann", "a")).holding
    assert first is not None
    normal = sched.submit(trial("bob", "b", "normal", at=1)).request
    low = sched.submit(trial("cid", "c", "low", at=2)).request
    high = sched.submit(trial("dan", "d", "high", at=3)).request
    assert [e.request for e in sched.queue()] == [high, normal, low]
    order = []
    for _ in range(3):
        sched.release(next(iter(sched.holdings)))
        [start] = sched.schedule()
        assert isinstance(start, Start)
        order.append(start.holding.request)
    assert order == [high, normal, low]


def test_dominant_share_orders_two_people() -> None:
    """Ann (weight 1) holds 2 GPUs, Bob (weight 4) holds 2: Bob's share is lower, so his
    trial goes first although Ann's waited longer, even once Ann holds only 1."""
    sched, _ = pool(4, {"people": {"bob": {"weight": 4}}})
    for _ in range(2):
        sched.submit(trial("ann", "a"))
        sched.submit(trial("bob", "b"))
    ann_next = sched.submit(trial("ann", "a", at=1)).request
    bob_next = sched.submit(trial("bob", "b", at=2)).request
    assert [e.request for e in sched.queue()] == [bob_next, ann_next]
    sched.release(next(h for h in sched.holdings.values() if h.request.person == "ann")
                  .request_id)
    [start] = sched.schedule()
    assert isinstance(start, Start) and start.holding.request == bob_next


def test_a_group_cap_holds_its_members_back_not_the_others() -> None:
    sched, _ = pool(8, {"groups": {"vision": {"max_gpus": 2}}})
    for person in ("ann", "bob"):
        assert sched.submit(trial(person, person, groups=("vision",))).started
    capped = sched.submit(trial("ann", "ann", groups=("vision",)))
    assert not capped.started and capped.reason == "over your group vision's cap of 2 GPUs"
    assert sched.submit(trial("cid", "cid")).started  # not held up behind ann
    sched.release(next(h for h in sched.holdings.values() if h.request.person == "bob")
                  .request_id)
    [start] = sched.schedule()
    assert isinstance(start, Start) and start.holding.request == capped.request


def test_a_person_cap_names_the_person_and_never_preempts() -> None:
    sched, _ = pool(2, {"people": {"ann": {"max_gpus": 1}}})
    sched.submit(notebook("ann"))
    sched.submit(trial("bob", "b"))
    decision = sched.submit(notebook("ann"))
    assert decision.reason == "over your cap of 1 GPUs" and not decision.actions


def test_queue_positions_and_reasons() -> None:
    sched, _ = pool(1)
    sched.submit(trial("ann", "a"))
    waits = [sched.submit(trial(p, p, at=i)) for i, p in enumerate(["bob", "cid", "dan"])]
    assert [d.position for d in waits] == [1, 2, 3]
    nb = sched.submit(notebook("eve", at=9))
    assert [(e.position, e.reason) for e in sched.queue()] == [
        (1, "waiting: a trial is stopping to free its GPUs for you"),
        (2, "waiting: pool full; 1 ahead"),
        (3, "waiting: pool full; 2 ahead"),
        (4, "waiting: pool full; 3 ahead"),
    ]
    assert sched.queue()[0].request == nb.request


def test_a_preempted_trial_is_requeued_as_the_same_trial_in_its_old_place() -> None:
    sched, clock = pool(1)
    running = sched.submit(trial("ann", "sweep-7")).holding
    assert running is not None
    later = sched.submit(trial("bob", "b", at=5)).request
    clock.now = 600.0
    sched.checkpointed(running.request_id, at=480.0)
    [stop] = sched.submit(notebook("cid", at=600)).actions
    assert isinstance(stop, Preemption) and stop.checkpoint_age == 120.0
    released = sched.release(running.request_id)
    back = released.requeued
    assert back is not None and back.preemptions == 1
    assert (back.sweep_id, back.trial_number, back.request_id) == (
        "sweep-7", running.request.trial_number, running.request_id)
    assert released.lost_seconds <= stop.checkpoint_age
    sched.schedule()  # the notebook starts
    assert [e.request for e in sched.queue()] == [back, later]  # its old place, ahead of bob
    assert sched.usage().lost_to_preemption == {"ann": 120.0}


def test_usage_adds_up_by_person_group_sweep_and_notebook() -> None:
    sched, clock = pool(4)
    t = sched.submit(trial("ann", "s1", gpus=2, groups=("vision",))).holding
    nb = sched.submit(notebook("bob", groups=("vision", "nlp"))).holding
    assert t and nb
    clock.now = 100.0
    sched.release(t.request_id)
    clock.now = 150.0
    usage = sched.usage()  # the notebook still runs: counted up to now
    assert usage.person == {"ann": 200.0, "bob": 150.0}
    assert usage.group == {"vision": 350.0, "nlp": 150.0}
    assert usage.sweep == {"s1": 200.0}
    assert usage.notebook == {nb.request_id: 150.0}
    assert usage.total == sum(usage.sweep.values()) + sum(usage.notebook.values())
    sched.release(nb.request_id)
    assert sched.free_gpus == 4 and sched.usage().person == {"ann": 200.0, "bob": 150.0}


@pytest.mark.parametrize(("config", "message"), [
    ({"people": {"ann": {"weight": 0}}}, "people.ann.weight must be a positive number"),
    ({"groups": {"vision": {"max_gpus": -1}}}, "groups.vision.max_gpus must be a whole"),
    ({"groups": {"vision": {"max_gpus": 1.5}}}, "groups.vision.max_gpus must be a whole"),
    ({"people": {"ann": {"wieght": 2}}}, "unknown field people.ann.wieght"),
    ({"default": {"weight": "x"}}, "default.weight must be a positive number"),
    ({"peple": {}}, "unknown field 'peple'"),
    ({"people": ["ann"]}, "people must be an object"),
])
def test_bad_share_config_names_the_field(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ShareConfig.from_dict(config)


def test_baselines_first_come_and_partitions() -> None:
    clock = Clock()
    fifo = Scheduler(["0"], FirstComePolicy(), clock)
    fifo.submit(trial("ann", "a"))
    late = fifo.submit(trial("bob", "b", "high"))
    nb = fifo.submit(notebook("cid"))
    assert not nb.actions and (late.position, nb.position) == (1, 2)
    parts = Scheduler(["0", "1"], PartitionedPolicy(["ann", "bob"]), clock)
    assert parts.submit(trial("ann", "a")).started
    idle_left = parts.submit(trial("ann", "a"))
    assert not idle_left.started and parts.free_gpus == 1  # bob's slice stays idle
    assert idle_left.reason == "waiting: your partition of 1 GPUs is full"


def test_sweep_priorities_are_the_pools_tiers() -> None:
    from tunehub_base.pool import PRIORITIES as POOL_PRIORITIES
    from tuner.spec import PRIORITIES

    assert PRIORITIES is POOL_PRIORITIES


@pytest.mark.parametrize("kind", ["fair", "partitioned", "first_come"])
def test_positions_agree_with_a_brute_force_recount(kind: str) -> None:
    """A random day of submits, starts, preemptions, requeues, checkpoints and withdrawals on
    a small pool with weights, group accounts and caps: after every step, every waiting
    request's position (read from the policy's order statistics in O(log n)) is the one
    recounted from scratch, and the queue is in the order recounted from scratch."""

    rng = random.Random(7)
    people = [f"u{i}" for i in range(9)]
    shares = ShareConfig.from_dict({
        "people": {"u0": {"weight": 2}, "u1": {"max_gpus": 2}, "u2": {"weight": 0.5}},
        "groups": {"vision": {"weight": 3, "max_gpus": 5}, "nlp": {"weight": 1.5}},
    })
    member = {p: rng.choice([(), ("vision",), ("nlp",), ("misc", "vision"), ("nlp", "vision")])
              for p in people}
    clock = Clock()
    policy = {"fair": lambda: FairPolicy(shares),
              "partitioned": lambda: PartitionedPolicy(people[:6], shares),
              "first_come": FirstComePolicy}[kind]()
    sched = Scheduler([str(i) for i in range(10)], policy, clock)
    waiting: dict[str, tuple[GpuRequest, int]] = {}  # request id -> (request, arrival)
    arrivals = itertools.count()

    def account(r: GpuRequest) -> str:
        return policy.shares.account(r)

    def share(acc: str) -> float:
        held = sum(h.request.gpus for h in sched.holdings.values()
                   if not h.stopping and account(h.request) == acc)
        return held / policy.shares.weight(acc)

    def brute_order() -> list[GpuRequest]:
        if kind == "first_come":
            return [r for r, _ in sorted(waiting.values(), key=lambda w: w[1])]
        oldest: dict[tuple[int, str], tuple[float, int]] = {}
        for r, n in waiting.values():
            k = (r.tier, account(r))
            oldest[k] = min(oldest.get(k, (float("inf"), 0)), (r.enqueued_at, n))
        return [r for r, _ in sorted(waiting.values(), key=lambda w: (
            -w[0].tier, share(account(w[0])), oldest[w[0].tier, account(w[0])],
            account(w[0]), w[0].enqueued_at, w[1]))]

    def brute_position(r: GpuRequest, order: list[GpuRequest]) -> int:
        """The count before order statistics: one comparison per account (ties in enqueue
        time within an account share the first place of the tie)."""
        if kind == "first_come":
            return order.index(r) + 1
        return 1 + next(i for i, w in enumerate(order) if w.tier == r.tier
                        and account(w) == account(r) and w.enqueued_at >= r.enqueued_at)

    def apply(actions: list[Any]) -> None:
        for action in actions:
            if isinstance(action, Start):
                del waiting[action.holding.request_id]

    def check() -> None:
        order = brute_order()
        assert [r.request_id for r in policy.ordered_waiting()] == [r.request_id for r in order]
        for r, _ in waiting.values():
            assert policy.position(r) == brute_position(r, order)

    stats = {"preempted": 0, "tied": 0, "most": 0}
    for _ in range(600):
        clock.now += rng.choice([0.0, 0.0, 1.0, 5.0])
        op = rng.random()
        if op < 0.45:
            person = rng.choice(people)
            at = clock.now - rng.choice([0.0, 0.0, 1.0, 3.0])  # ties within an account
            if rng.random() < 0.2:
                request = notebook(person, gpus=rng.choice([1, 1, 2]), at=at,
                                   groups=member[person])
            else:
                request = trial(person, f"s-{person}", rng.choice(["low", "normal", "high"]),
                                rng.choice([1, 1, 1, 2, 3]), member[person], at)
            waiting[request.request_id] = (request, next(arrivals))
            decision = sched.submit(request)
            apply(decision.actions)
            if not decision.started:
                assert decision.position == brute_position(request, brute_order())
        elif op < 0.75 and sched.holdings:
            rid = rng.choice(sorted(sched.holdings))
            released = sched.release(rid)
            if released.requeued is not None:
                waiting[rid] = (released.requeued, next(arrivals))
                stats["preempted"] += 1
            apply(sched.schedule())
        elif op < 0.85 and sched.holdings:
            rid = rng.choice(sorted(sched.holdings))
            if not sched.holdings[rid].stopping:
                sched.checkpointed(rid)
        elif waiting:
            rid = rng.choice(sorted(waiting))
            sched.withdraw(rid)
            del waiting[rid]
            apply(sched.schedule())
        check()
        stats["most"] = max(stats["most"], len(waiting))
        times = [(r.tier, account(r), r.enqueued_at) for r, _ in waiting.values()]
        stats["tied"] += len(times) - len(set(times))
    # The scenario reached what positions must get right: a long queue, requeued trials, ties.
    assert stats["most"] >= 20 and stats["tied"] > 0
    assert stats["preempted"] > 0 or kind != "fair"


# --- laying out a pool that exists already (the local queue does so at each decision) ------


def test_adopted_checkpoint_times_choose_the_victim_not_the_start() -> None:
    """The trial that started first but saved a checkpoint a moment ago is the cheaper one to
    stop than the one that started later and never saved."""
    clock = Clock()
    clock.now = 100.0
    scheduler = Scheduler(["0", "1"], FairPolicy(), clock)
    early, late = trial("ana", priority="low"), trial("ana", priority="low")
    scheduler.adopt(early, ["0"], since=10.0, last_checkpoint_at=99.0)
    scheduler.adopt(late, ["1"], since=50.0)
    decision = scheduler.submit(trial("bob", priority="normal", at=100.0))
    assert [a.victim.request_id for a in decision.actions if isinstance(a, Preemption)] == [
        early.request_id]
    assert [a.checkpoint_age for a in decision.actions if isinstance(a, Preemption)] == [1.0]


def test_submit_all_starts_in_the_policys_order_not_the_submission_order() -> None:
    scheduler = Scheduler(["0"], FairPolicy(), Clock())
    low, high = trial("ana", priority="low", at=1.0), trial("bob", priority="high", at=2.0)
    actions = scheduler.submit_all([low, high])
    assert [a.holding.request_id for a in actions if isinstance(a, Start)] == [high.request_id]
    assert [(e.request.request_id, e.position) for e in scheduler.queue()] == [
        (low.request_id, 1)]
    with pytest.raises(ValueError):
        scheduler.submit_all([low])  # already waiting


def test_a_cap_holds_back_a_trial_beside_a_free_gpu() -> None:
    shares = ShareConfig.from_dict({"people": {"ana": {"max_gpus": 1}}})
    scheduler = Scheduler(["0", "1"], FairPolicy(shares), Clock())
    first, second = trial("ana", at=1.0), trial("ana", at=2.0)
    actions = scheduler.submit_all([first, second])
    assert [a.holding.request_id for a in actions if isinstance(a, Start)] == [first.request_id]
    assert scheduler.free_gpus == 1
    [entry] = scheduler.queue()
    assert entry.request == second and entry.reason == "over your cap of 1 GPUs"
