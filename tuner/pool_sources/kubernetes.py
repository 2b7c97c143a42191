"""The pool of a cluster, read through the Kubernetes API with the backend's client
(:class:`tuner.backends.kubernetes.api.Kube`) under the chart's tuner Role:

- who holds GPUs: the release's pods asking for the GPU resource, bound and not finished
  (``list pods``; a trial's person from its Job's owner annotation, ``list jobs``);
- each flavor's capacity and use: the ClusterQueue's nominal quota and ``flavorsUsage`` for
  the GPU resource (``get clusterqueues``, granted by the chart's ClusterRole for that one
  name);
- the queue: the namespace's pending GPU Workloads (``list workloads``) with their place from
  Kueue's visibility API (``get localqueues/pendingworkloads``) and Kueue's reason;
- GPU-hours: the holdings :mod:`.kube_recorder` writes to the database;
- what each trial pod's GPUs do and the GPU-hours it used: its own readings, which the tuner
  keeps in its holding's row (:mod:`.kube_use`); a notebook pod's: its server's reports to
  the hub, which the tuner reads into its row (:mod:`.kube_notebook_use`).

Each read that is refused or fails leaves its part empty with the reason in ``errors``,
never a failed page: the pool is a view."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from tunehub_base.gpu_holders import Holder, usage_report
from tuner.backends.kubernetes import manifests as m
from tuner.backends.kubernetes import pool as kp
from tuner.backends.kubernetes.api import Kube, connect, describe
from tuner.backends.kubernetes.job_pods import JOB_NAME_LABEL
from tuner.backends.kubernetes.settings import KubeSettings
from tuner.db import Database
from tuner.pool_sources._base import PoolSource
from tuner.pool_sources.kube_ledger import KubeHoldingLedger
from tuner.pool_sources.kube_notebook_use import NotebookUseReader
from tuner.pool_sources.kube_recorder import HoldingRecorder, release_pods
from tuner.pool_sources.kube_use import PodUseWriter, row_figures
from tuner.pool_view import iso
from tuner.scheduling.hub_groups import HubGroups

log = logging.getLogger("tunehub.pool")


class KubernetesPoolSource(PoolSource):
    mode = "kubernetes"

    def __init__(self, settings: KubeSettings, db: Database,
                 groups_of: Callable[[str], tuple[str, ...]] = lambda person: (),
                 hub: HubGroups | None = None) -> None:
        """``groups_of``: the hub groups a person is a member of (their pods' GPU-hours
        count for those groups too); ``hub``: the hub's API as this service reaches it,
        where notebook servers' GPU reports are read (None: notebook rows show allocation
        only)."""
        self.settings = settings
        self.groups_of = groups_of
        self.ledger = KubeHoldingLedger(db)
        #: Where the controllers' meters of trial pods go (:meth:`SweepHost.gpu_use_sink`).
        self.use_writer = PodUseWriter(self.ledger)
        self.notebook_use = None if hub is None else NotebookUseReader(
            self.ledger, hub.api_url, hub.token, hub.verify)
        self.kube: Kube | None = None
        self.recorder: HoldingRecorder | None = None
        self._recording: asyncio.Task[None] | None = None
        self._reading: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Connect and start recording holdings; a cluster that cannot be reached is logged
        and tried again at the next view (the service serves without it)."""
        if self.notebook_use is not None and self._reading is None:
            self._reading = asyncio.get_running_loop().create_task(
                self.notebook_use.run(), name="k8s-notebook-gpu-use")
        try:
            await self._connect()
        except Exception as exc:
            log.warning("the GPU pool on Kubernetes cannot be read yet: %s", describe(exc))

    async def _connect(self) -> Kube:
        if self.kube is None:
            self.kube = Kube(await connect(self.settings), self.settings.namespace)
            self.recorder = HoldingRecorder(self.kube, self.settings, self.ledger,
                                            groups_of=self.groups_of)
            self._recording = asyncio.get_running_loop().create_task(
                self.recorder.run(), name="k8s-gpu-holdings")
        return self.kube

    async def close(self) -> None:
        await self.use_writer.close()
        for task in (self._recording, self._reading):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self.kube is not None:
            await self.kube.close()
            self.kube = None

    def _queue_name(self) -> str:
        s = self.settings
        return f"ClusterQueue {s.cluster_queue}" if s.cluster_queue else f"LocalQueue {s.queue}"

    async def pool(self) -> dict[str, Any]:
        s, resource = self.settings, self.settings.gpu_names.resource
        errors: list[str] = []

        async def read(what: str, call: Any, default: Any) -> Any:
            try:
                return await call
            except Exception as exc:  # a part unread is a reason shown, not a failed page
                errors.append(f"{what}: {describe(exc)}")
                return default

        kube = await self._connect()
        pods, jobs = await asyncio.gather(
            read("pods", kube.list("pods", release_pods(s)), {}),
            read("jobs", kube.list("jobs", m.selector(s)), {}))
        pods, jobs = pods.get("items") or [], jobs.get("items") or []
        workloads: list[dict[str, Any]] = []
        cluster_queue: dict[str, Any] | None = None
        summary = None
        if s.queue:
            workloads = (await read("workloads", kube.list("workloads", ""), {})).get(
                "items") or []
            summary = await read("pending workloads", kube.pending_workloads(s.queue), None)
        if s.cluster_queue:
            cluster_queue = await read(f"ClusterQueue {s.cluster_queue}",
                                       kube.cluster_queue(s.cluster_queue), None)
        owners = kp.job_owners(jobs)
        who: dict[str, Holder | None] = {p["metadata"]["name"]: kp.pod_holder(p, owners)
                                         for p in pods}
        who.update({j["metadata"]["name"]: kp.job_holder(j) for j in jobs})
        flavors = kp.workload_flavors(workloads, resource)
        now = time.time()
        rows = []
        for pod in pods:
            if not kp.holds(pod, resource):
                continue
            labels = pod["metadata"].get("labels") or {}
            owner = labels.get(JOB_NAME_LABEL) or pod["metadata"]["name"]
            flavor = flavors.get(owner) or kp.gpu_type(pod, s)
            row = kp.holding(pod, who.get(pod["metadata"]["name"]), flavor, resource, now)
            row["since_iso"] = iso(row["since"])
            row["held_seconds"] = max(0.0, now - row["since"])
            rows.append(row)
        uses = await read("measured use", asyncio.to_thread(
            self.ledger.uses, [r["uid"] for r in rows if r.get("uid")]), {})
        for row in rows:
            row.update(row_figures(uses.get(row.get("uid")),
                                   (row.get("holder") or {}).get("kind"), now))
        rows.sort(key=lambda r: (r["node"] or "", r["since"]))
        flavor_rows = kp.flavor_rows(cluster_queue, resource) if cluster_queue else []
        priorities = {v: k for k, v in s.workload_priority_classes.items()}
        queue = kp.queue_rows(workloads, kp.places(summary), self._queue_name(), who,
                              resource, priorities)
        held = sum(int(r["gpus"]) for r in rows)
        total = int(sum(f["nominal"] for f in flavor_rows)) if flavor_rows else None
        source = (f"Kueue ClusterQueue {s.cluster_queue}" if flavor_rows
                  else f"pods in namespace {s.namespace}")
        view: dict[str, Any] = {
            "mode": self.mode, "gpu_source": source, "namespace": s.namespace,
            "resource": resource, "total": held if total is None else total, "held": held,
            "gpus": rows, "flavors": flavor_rows, "queue": queue, "groups": [],
            "shares": kp.person_rows(rows, queue, cluster_queue, self._queue_name(), total)}
        if errors:
            view["errors"] = errors
        return view

    async def usage(self, since: float) -> dict[str, Any]:
        now = time.time()
        spans = await asyncio.to_thread(self.ledger.spans, since, now)
        report = usage_report(spans, since, now)
        report["since_iso"] = iso(report["since"])
        report["until_iso"] = iso(report["until"])
        report["mode"] = self.mode
        return report
