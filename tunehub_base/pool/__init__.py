"""Who holds each GPU of the shared pool: one policy, decided by one scheduler.

Interactive notebooks first, then sweeps by ``priority`` and by each person's (or hub group's)
share; a notebook that needs a GPU on a full pool preempts a trial, which goes back to the queue
from its last checkpoint; everyone else waits with a position and a reason.

Pure decisions on an injected clock (:class:`Scheduler`), with the policy as a small base class
and one module per implementation (:class:`FairPolicy`, the product's; :class:`FirstComePolicy`
and :class:`PartitionedPolicy`, the baselines ``benchmarks/pool.py`` compares it with). On one
machine the tuner's :mod:`tuner.scheduling.gpu_queue` lays the lock files of
:class:`tunehub_base.gpus.GpuPool` out for it (:meth:`Scheduler.adopt`) and carries out what it
decides for notebooks and trials; Kubernetes mode does not use it yet. Weights and caps come
from ``TUNEHUB_POOL_SHARES`` (:mod:`tunehub_base.pool.shares_setting`).
"""

from __future__ import annotations

from tunehub_base.pool._base import CapHit, Policy
from tunehub_base.pool.decisions import (
    Action,
    Decision,
    Preemption,
    QueueEntry,
    Released,
    Start,
)
from tunehub_base.pool.fair import FairPolicy
from tunehub_base.pool.first_come import FirstComePolicy
from tunehub_base.pool.partitioned import PartitionedPolicy
from tunehub_base.pool.request import PRIORITIES, GpuRequest, Holding
from tunehub_base.pool.scheduler import Scheduler
from tunehub_base.pool.shares import Share, ShareConfig
from tunehub_base.pool.usage import UsageReport

__all__ = [
    "PRIORITIES", "Action", "CapHit", "Decision", "FairPolicy", "FirstComePolicy", "GpuRequest",
    "Holding", "PartitionedPolicy", "Policy", "Preemption", "QueueEntry", "Released",
    "Scheduler", "Share", "ShareConfig", "Start", "UsageReport",
]
