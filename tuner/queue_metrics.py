"""The GPU pool's queue and shares as Prometheus metrics (issues 25 and 26): how long the line
is, how long its oldest has waited, and each person's share and cap, for an operator's graphs
and alerts ("someone has waited an hour for a GPU").

Why a snapshot taken by the scrape's handler rather than a read inside :meth:`collect`: the
queue's picture needs the lock files read in a worker thread (:meth:`GpuQueue.view`), which a
synchronous collector on the event loop cannot await. The ``/metrics`` route awaits
:meth:`refresh` (without waiting for a notebook's preemption under way), then
``generate_latest`` renders what it found. Labels are
bounded: ``kind`` is ``notebook`` or ``trial``; ``person`` is someone holding a GPU, waiting
for one, or named in ``TUNEHUB_POOL_SHARES`` (the lab's people, never sweeps or trials)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

if TYPE_CHECKING:
    from tuner.scheduling.gpu_queue import GpuQueue

log = logging.getLogger(__name__)

#: The kinds of request in the queue: every one is always exported (0 when none waits).
KINDS = ("notebook", "trial")


class GpuQueueCollector:
    """``tunehub_gpu_queue_length{kind}`` (requests waiting), ``tunehub_gpu_queue_gpus{kind}``
    (GPUs they ask for), ``tunehub_gpu_queue_oldest_wait_seconds{kind}`` (the longest wait
    now, 0 when none waits); per person ``tunehub_gpu_person_held_gpus``,
    ``tunehub_gpu_fair_share_gpus`` (what the weights entitle them to among those present),
    ``tunehub_gpu_share_ratio`` (held / fair share: above 1, more than their share) and
    ``tunehub_gpu_cap_gpus`` (only for people with a cap)."""

    def __init__(self, queue: GpuQueue) -> None:
        self.queue = queue
        self._view: dict[str, Any] | None = None
        self._at = 0.0

    async def refresh(self) -> None:
        """Take the queue's picture for the next :meth:`collect` (never raises: a scrape
        that cannot read the pool leaves these figures out rather than failing)."""
        try:
            self._view = await self.queue.view(wait=False)
            self._at = time.time()
        except Exception:  # noqa: BLE001 - a scrape must never fail on the pool
            log.exception("the GPU queue could not be read for the metrics")
            self._view = None

    def collect(self) -> Iterator[Metric]:
        view = self._view
        if view is None:
            return
        yield from queue_families(view.get("queue", []), self._at)
        yield from _shares(view.get("shares", []))


def queue_families(entries: list[dict[str, Any]], at: float) -> Iterator[Metric]:
    """The queue's length, GPUs asked for and longest wait at ``at``, by kind: one shape for
    the local queue and Kueue's pending Workloads (:mod:`tuner.pool_sources.kube_metrics`)."""
    length = GaugeMetricFamily("tunehub_gpu_queue_length",
                               "Requests waiting for a GPU, by kind", labels=["kind"])
    gpus = GaugeMetricFamily("tunehub_gpu_queue_gpus",
                             "GPUs asked for by the requests waiting, by kind",
                             labels=["kind"])
    oldest = GaugeMetricFamily("tunehub_gpu_queue_oldest_wait_seconds",
                               "How long the longest-waiting request has waited, by kind "
                               "(0 when none waits)", labels=["kind"])
    counts = dict.fromkeys(KINDS, 0)
    asked = dict.fromkeys(KINDS, 0)
    waited = dict.fromkeys(KINDS, 0.0)
    for entry in entries:
        kind = entry["kind"] if entry["kind"] in KINDS else "notebook"
        counts[kind] += 1
        asked[kind] += int(entry.get("gpus") or 0)
        since = entry.get("since")
        if since is not None:
            waited[kind] = max(waited[kind], at - float(since))
    for kind in KINDS:
        length.add_metric([kind], counts[kind])
        gpus.add_metric([kind], asked[kind])
        oldest.add_metric([kind], max(0.0, waited[kind]))
    yield length
    yield gpus
    yield oldest


def person_held(held: dict[str, float]) -> GaugeMetricFamily:
    """``tunehub_gpu_person_held_gpus``: GPUs each person holds now."""
    family = GaugeMetricFamily("tunehub_gpu_person_held_gpus", "GPUs a person holds now",
                               labels=["person"])
    for person, gpus in sorted(held.items()):
        family.add_metric([person], gpus)
    return family


def _shares(rows: list[dict[str, Any]]) -> Iterator[Metric]:
    fair = GaugeMetricFamily("tunehub_gpu_fair_share_gpus",
                             "GPUs a person's account is entitled to among those present now",
                             labels=["person"])
    ratio = GaugeMetricFamily("tunehub_gpu_share_ratio",
                              "GPUs a person holds / their fair share (above 1: more than it)",
                              labels=["person"])
    cap = GaugeMetricFamily("tunehub_gpu_cap_gpus", "A person's cap on GPUs held at once "
                            "(TUNEHUB_POOL_SHARES; absent: no cap)", labels=["person"])
    for row in rows:
        person = str(row["person"])
        fair_share = float(row.get("fair_share_gpus") or 0.0)
        fair.add_metric([person], fair_share)
        ratio.add_metric([person], float(row.get("held_gpus") or 0) / fair_share
                         if fair_share > 0 else 0.0)
        if row.get("max_gpus") is not None:
            cap.add_metric([person], float(row["max_gpus"]))
    yield person_held({str(r["person"]): float(r.get("held_gpus") or 0) for r in rows})
    yield fair
    yield ratio
    yield cap


def watch_gpu_queue(queue: GpuQueue,
                    registry: CollectorRegistry = REGISTRY) -> GpuQueueCollector:
    """Add the queue's figures to the scrape (once per process); the route refreshes them."""
    collector = GpuQueueCollector(queue)
    registry.register(collector)
    return collector
