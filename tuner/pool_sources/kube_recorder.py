"""Writing down who held GPUs on Kubernetes as it happens: one watch of the release's pods
(``app.kubernetes.io/instance``: trial pods and the hub's notebook pods alike, which the
Role's pod list and watch already cover), each pod asking for the GPU resource recorded in
:class:`.kube_ledger.KubeHoldingLedger`:

- bound to a node and not finished: a holding opened, since its start (``status.startTime``);
- finished (``Succeeded``/``Failed``): closed when its last container finished;
- deleted while holding: closed at that moment;
- gone from a fresh list while its row is open (it went while no tuner watched): closed at
  the list's moment, ``stale`` (its real end lies somewhere before).

A trial pod's person is its Job's owner annotation (one ``get`` per Job, remembered); the hub
groups that person is a member of when the pod is first seen (``groups_of``, read from the hub:
:mod:`tuner.scheduling.hub_groups`) are written with the holding, so its GPU-hours count for
them too."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from tunehub_base.gpu_holders import Holder
from tuner.backends.kubernetes import manifests as m
from tuner.backends.kubernetes import pool as kp
from tuner.backends.kubernetes.api import Kube
from tuner.backends.kubernetes.job_pods import JOB_NAME_LABEL
from tuner.backends.kubernetes.settings import KubeSettings
from tuner.backends.kubernetes.watch import Listed, Watch
from tuner.pool_sources.kube_ledger import KubeHoldingLedger

log = logging.getLogger("tunehub.pool")
OWNERS_KEPT = 4096  # Job owners remembered (a Job's pods come and go within minutes)


def release_pods(settings: KubeSettings) -> str:
    """The label selector of every pod of this release: its trials' and its notebooks'."""
    return f"{m.INSTANCE_LABEL}={settings.instance}"


def finished_at(pod: dict[str, Any]) -> float | None:
    """When the pod's last container finished; None while one runs or none said."""
    ends = []
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated") or {}
        when = kp.timestamp(terminated.get("finishedAt"))
        if when is None:
            return None
        ends.append(when)
    return max(ends) if ends else None


class HoldingRecorder:
    """Follows the release's pods and keeps the ledger. ``clock``: seconds, for tests."""

    def __init__(self, kube: Kube, settings: KubeSettings, ledger: KubeHoldingLedger,
                 clock: Callable[[], float] = time.time,
                 groups_of: Callable[[str], tuple[str, ...]] = lambda person: ()) -> None:
        self.kube, self.settings, self.ledger, self.clock = kube, settings, ledger, clock
        self.groups_of = groups_of
        self.resource = settings.gpu_names.resource
        self._owners: dict[str, str] = {}
        self.watch = Watch(kube, "pods", (release_pods(settings), None), self._on_pod,
                           self._before_list)

    async def _owner(self, job: str) -> str:
        if job not in self._owners:
            try:
                found = await self.kube.get_job(job)
            except ApiException as exc:
                log.warning("reading Job %s for its owner: %s", job, exc.status)
                found = None
            if len(self._owners) >= OWNERS_KEPT:
                self._owners.clear()
            self._owners[job] = kp.job_owners([found])[job] if found else ""
        return self._owners[job]

    async def _holder(self, pod: dict[str, Any]) -> Holder | None:
        labels = pod["metadata"].get("labels") or {}
        job = labels.get(JOB_NAME_LABEL) or labels.get("job-name") or ""
        owners = {job: await self._owner(job)} if job and labels.get(m.SWEEP_LABEL) else {}
        holder = kp.pod_holder(pod, owners)
        if holder is None:
            return None
        return dataclasses.replace(holder, groups=self.groups_of(holder.person))

    async def _on_pod(self, pod: dict[str, Any], deleted: bool) -> None:
        spec = pod.get("spec") or {}
        if not spec.get("nodeName") or kp.pod_gpus(pod, self.resource) == 0:
            return  # never held a GPU (not scheduled yet, or asks for none)
        uid = pod["metadata"]["uid"]
        end = None
        if (pod.get("status") or {}).get("phase") in kp.FINISHED:
            end = finished_at(pod) or self.clock()  # (an evicted pod may say no finish)
        elif deleted:
            end = self.clock()
        if end is not None and await asyncio.to_thread(self.ledger.closed, uid, end):
            return
        holder = await self._holder(pod)
        if holder is None:
            return  # not a trial's or a notebook's pod
        row = kp.holding(pod, holder, "", self.resource, self.clock())
        await asyncio.to_thread(self.ledger.opened, uid, pod["metadata"]["name"], holder,
                                row["gpus"], kp.gpu_type(pod, self.settings) or None,
                                row["since"], end)

    def _before_list(self) -> Listed:
        async def gone(pods: list[dict[str, Any]]) -> None:
            live = {p["metadata"]["uid"] for p in pods}
            now = self.clock()
            for uid in await asyncio.to_thread(self.ledger.open_uids) - live:
                await asyncio.to_thread(self.ledger.closed, uid, now, True)
        return gone

    async def run(self) -> None:
        await self.watch.run()
        if self.watch.error:
            log.warning("GPU-hours on Kubernetes are not recorded: cannot watch the "
                        "release's pods: %s", self.watch.error)
