"""The cluster's GPU pool as Prometheus metrics, under the names one machine exports
(:mod:`tuner.metrics`, :mod:`tuner.queue_metrics`), so one dashboard reads both modes:

- ``tunehub_gpu_held{gpu, kind}``: GPUs held, ``gpu`` the flavor (GPU type; ``GPU`` when the
  pod names none), one series per kind (0 when none);
- ``tunehub_gpu_person_held_gpus{person}``;
- ``tunehub_gpu_allocated_seconds_total`` / ``tunehub_gpu_used_seconds_total{person, kind}``:
  the holdings table, all time (used: trial pods' own readings; notebook pods count none);
- ``tunehub_gpu_utilization_ratio{gpu}`` / ``tunehub_gpu_memory_used_bytes{gpu}``: each trial
  pod's GPUs as it last reported them, ``gpu`` = ``<pod>/<GPU index in the pod>``;
- ``tunehub_gpu_queue_length`` / ``_gpus`` / ``_oldest_wait_seconds{kind}``: the pending GPU
  Workloads;
- Kubernetes only: ``tunehub_gpu_flavor_quota_gpus``, ``tunehub_gpu_flavor_used_gpus``,
  ``tunehub_gpu_flavor_borrowed_gpus{flavor}`` (the ClusterQueue's quota and Kueue's use).

Not exported here: fair shares, ratios and caps (on a cluster Kueue's fair sharing decides,
not tunehub's weights). As for the local queue, the scrape's route awaits :meth:`refresh`
(the reads are the pool view's API calls and a database sum), then ``collect`` renders them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from tunehub_base.gpu_holders import KINDS
from tuner.metrics import doing, gpu_seconds, held_family
from tuner.queue_metrics import person_held, queue_families

if TYPE_CHECKING:
    from tuner.pool_sources.kubernetes import KubernetesPoolSource

log = logging.getLogger("tunehub.pool")


class KubePoolCollector:
    """The figures of :class:`~tuner.pool_sources.kubernetes.KubernetesPoolSource`."""

    def __init__(self, source: KubernetesPoolSource) -> None:
        self.source = source
        self._view: dict[str, Any] | None = None
        self._totals: list[tuple[str, str, float, float]] = []
        self._at = 0.0

    async def refresh(self) -> None:
        """Read the pool for the next :meth:`collect` (never raises: a scrape that cannot
        read the cluster leaves these figures out rather than failing)."""
        try:
            self._at = time.time()
            self._view = await self.source.pool()
            self._totals = await asyncio.to_thread(self.source.ledger.totals, self._at)
        except Exception:  # noqa: BLE001 - a scrape must never fail on the pool
            log.exception("the GPU pool on Kubernetes could not be read for the metrics")
            self._view = None

    def collect(self) -> Iterator[Metric]:
        view = self._view
        if view is None:
            return
        rows = view.get("gpus") or []
        held = held_family()
        by_flavor: defaultdict[str, dict[str, float]] = defaultdict(
            lambda: dict.fromkeys(KINDS, 0.0))
        people: defaultdict[str, float] = defaultdict(float)
        for flavor in view.get("flavors") or []:
            by_flavor[str(flavor["flavor"])]  # noqa: B018 - every flavor, held or not
        for row in rows:
            holder = row.get("holder") or {}
            counts = by_flavor[str(row.get("flavor") or "GPU")]
            if holder.get("kind") in counts:
                counts[holder["kind"]] += float(row.get("gpus") or 0)
            if holder.get("person"):
                people[str(holder["person"])] += float(row.get("gpus") or 0)
        for flavor, counts in sorted(by_flavor.items()):
            for kind, gpus in counts.items():
                held.add_metric([flavor, kind], gpus)
        yield held
        yield person_held(people)
        yield from gpu_seconds({(p, k): a for p, k, a, _ in self._totals},
                               {(p, k): u for p, k, _, u in self._totals})
        yield from doing(_readings(rows))
        yield from queue_families(view.get("queue") or [], self._at)
        yield from _flavors(view.get("flavors") or [])


def _readings(rows: list[dict[str, Any]]) -> Iterator[tuple[str, float | None, int | None]]:
    """Each trial pod's GPUs as last reported, where its figures are fresh."""
    for row in rows:
        if row.get("utilization") is None:
            continue  # never measured, no figures, or too old
        for gpu, use in sorted(((row.get("use") or {}).get("gpus") or {}).items()):
            last = use.get("last") or {}
            yield f"{row['pod']}/{gpu}", last.get("utilization"), last.get("memory_used_bytes")


def _flavors(rows: list[dict[str, Any]]) -> Iterator[Metric]:
    families = {key: GaugeMetricFamily(f"tunehub_gpu_flavor_{name}_gpus", text,
                                       labels=["flavor"])
                for key, name, text in (
                    ("nominal", "quota", "A Kueue flavor's nominal GPU quota in the ClusterQueue"),
                    ("used", "used", "GPUs of a Kueue flavor in use (Kueue's flavorsUsage)"),
                    ("borrowed", "borrowed", "GPUs of a flavor borrowed from the cohort"))}
    for row in rows:
        for key, family in families.items():
            family.add_metric([str(row["flavor"])], float(row.get(key) or 0))
    yield from families.values()


def watch_kube_pool(source: KubernetesPoolSource,
                    registry: CollectorRegistry = REGISTRY) -> KubePoolCollector:
    """Add the cluster's pool to the scrape, instead of one machine's (once per process: the
    names are the same, so the local pool's collectors are not registered beside it)."""
    collector = KubePoolCollector(source)
    registry.register(collector)
    return collector
