"""A Kueue stand-in: quota-based admission of suspended Jobs queued with the
``kueue.x-k8s.io/queue-name`` label, the way Kueue's job integration behaves.

For each queued Job it keeps a ``Workload`` (owned by the Job); a Workload is admitted when its
whole pod set (parallelism x requests, all workers at once) fits the nominal quota of a flavor
of its ClusterQueue (flavors tried in order); admission unsuspends the Job and injects the
flavor's ``nodeLabels`` / ``tolerations`` into the pod template. Higher-priority workloads are
admitted first and, if the ClusterQueue's ``preemption.withinClusterQueue`` is
``LowerPriority``, evict lower-priority admitted ones (their Job is suspended again). Pending
workloads carry Kueue's message (``couldn't assign flavors to pod set main: insufficient quota
for nvidia.com/gpu in flavor a100, 2 more needed``). Not emulated: cohorts, borrowing, fair
sharing, LimitRanges, WorkloadPriorityClasses, admission checks.

Like Kueue 0.20 it serves only ``kueue.x-k8s.io/v1beta2`` (``v1beta1`` paths are 404), and the
emulator validates every Kueue object against Kueue's own v1beta2 CRD schemas
(``kubesim/crds``), unknown fields refused as with ``kubectl apply --validate=strict``."""

from __future__ import annotations

import asyncio
import copy
import logging
from decimal import Decimal

from .admission import now
from .client import ApiFailure, HarnessClient, Informer, path_of
from .jobs import _finished
from .nodes import pod_requests
from .objects import JSON
from .validation import parse_quantity

log = logging.getLogger(__name__)

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
API = "/apis/kueue.x-k8s.io/v1beta2"

#: Quota used per (flavor, resource).
Usage = dict[tuple[str, str], Decimal]


def _fmt(amount: Decimal) -> str:
    return str(int(amount)) if amount == int(amount) else str(amount)


class KueueController:
    def __init__(self, url: str) -> None:
        self.client = HarnessClient(url, "kueue")
        self.jobs = Informer(self.client, "/apis/batch/v1/jobs", self._changed)
        self.local = Informer(self.client, f"{API}/localqueues", self._changed)
        self.cluster = Informer(self.client, f"{API}/clusterqueues", self._changed)
        self.flavors = Informer(self.client, f"{API}/resourceflavors", self._changed)
        self.classes = Informer(self.client, "/apis/scheduling.k8s.io/v1/priorityclasses",
                                self._changed)
        # job uid -> (cluster queue, {resource: flavor}, usage per (flavor, resource))
        self.admitted: dict[str, tuple[str, dict[str, str], Usage]] = {}
        self._pending_msg: dict[str, str] = {}
        self._dirty = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        informers = (self.jobs, self.local, self.cluster, self.flavors, self.classes)
        self._tasks = [asyncio.create_task(i.run()) for i in informers]
        self._tasks.append(asyncio.create_task(self._loop()))
        for i in informers:
            await asyncio.wait_for(i.synced.wait(), 30)

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.client.close()

    async def _changed(self, type_: str, obj: JSON) -> None:
        self._dirty.set()

    async def _loop(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                await self.reconcile()
            except Exception:
                log.exception("kueue pass failed")
                await asyncio.sleep(0.5)  # do not spin on a persistent error
                self._dirty.set()

    def _priority(self, job: JSON) -> int:
        name = job["spec"]["template"]["spec"].get("priorityClassName")
        pc = self.classes.cache.get(("", name)) if name else None
        return int(pc.get("value", 0)) if pc else 0

    @staticmethod
    def _request(job: JSON) -> dict[str, Decimal]:
        per_pod = pod_requests({"spec": job["spec"]["template"]["spec"]})
        count = job["spec"].get("parallelism", 1)
        return {k: v * count for k, v in per_pod.items() if v}

    def _queued(self) -> list[JSON]:
        live = {j["metadata"]["uid"] for j in self.jobs.cache.values()}
        for uid in [u for u in self.admitted if u not in live]:
            del self.admitted[uid]
        out = []
        for job in self.jobs.cache.values():
            if QUEUE_LABEL not in (job["metadata"].get("labels") or {}):
                continue
            if _finished(job):
                self.admitted.pop(job["metadata"]["uid"], None)
                continue
            out.append(job)
        return out

    def _usage(self, cq: str) -> Usage:
        used: Usage = {}
        for q, _, usage in self.admitted.values():
            if q == cq:
                for key, amount in usage.items():
                    used[key] = used.get(key, 0) + amount
        return used

    def _assign(self, cq: JSON, request: dict[str, Decimal], used: Usage
                ) -> tuple[dict[str, str], Usage] | str:
        """Flavor per resource and usage per (flavor, resource), or Kueue's pending message."""
        assignment: dict[str, str] = {}
        usage: Usage = {}
        for resource, amount in sorted(request.items()):
            if resource == "pods":
                continue
            group = next((g for g in cq["spec"].get("resourceGroups") or []
                          if resource in g.get("coveredResources", [])), None)
            if group is None:
                return (f"couldn't assign flavors to pod set main: resource {resource} "
                        f"unavailable in ClusterQueue")
            missing = []
            for flavor in group.get("flavors") or []:
                quota = {r["name"]: parse_quantity(r["nominalQuota"])
                         for r in flavor.get("resources") or []}
                free = quota.get(resource, Decimal(0)) - used.get((flavor["name"], resource), 0)
                if amount <= free:
                    assignment[resource] = flavor["name"]
                    key = (flavor["name"], resource)
                    usage[key] = usage.get(key, 0) + amount
                    break
                missing.append(f"insufficient quota for {resource} in flavor {flavor['name']}, "
                               f"{_fmt(amount - max(free, Decimal(0)))} more needed")
            else:
                return "couldn't assign flavors to pod set main: " + ", ".join(missing)
        return assignment, usage

    async def reconcile(self) -> None:
        queued = self._queued()
        pending = [j for j in queued if j["metadata"]["uid"] not in self.admitted]
        pending.sort(key=lambda j: (-self._priority(j), j["metadata"]["creationTimestamp"]))
        for job in pending:
            ns = job["metadata"]["namespace"]
            lq = self.local.cache.get((ns, job["metadata"]["labels"][QUEUE_LABEL]))
            if lq is None:
                await self._pending(job, f"LocalQueue {job['metadata']['labels'][QUEUE_LABEL]} "
                                         "doesn't exist")
                continue
            cq = self.cluster.cache.get(("", lq["spec"].get("clusterQueue", "")))
            if cq is None:
                await self._pending(job, f"ClusterQueue {lq['spec'].get('clusterQueue')} "
                                         "doesn't exist")
                continue
            name = cq["metadata"]["name"]
            result = self._assign(cq, self._request(job), self._usage(name))
            if isinstance(result, str):
                victims = self._victims(cq, job)
                if victims is None:
                    await self._pending(job, result)
                    continue
                for victim in victims:
                    await self._evict(victim, job)
                result = self._assign(cq, self._request(job), self._usage(name))
                if isinstance(result, str):
                    await self._pending(job, result)
                    continue
            await self._admit(job, name, *result)

    def _victims(self, cq: JSON, job: JSON) -> list[JSON] | None:
        policy = ((cq["spec"].get("preemption") or {}).get("withinClusterQueue") or "Never")
        if policy == "Never":
            return None
        prio = self._priority(job)
        name = cq["metadata"]["name"]
        candidates = sorted((j for j in self.jobs.cache.values()
                             if self.admitted.get(j["metadata"]["uid"], ("",))[0] == name
                             and self._priority(j) < prio),
                            key=lambda j: (self._priority(j),
                                           j["metadata"]["creationTimestamp"]), reverse=False)
        chosen: list[JSON] = []
        used = self._usage(name)
        for victim in candidates:
            chosen.append(victim)
            for key, amount in self.admitted[victim["metadata"]["uid"]][2].items():
                used[key] = used.get(key, 0) - amount
            if not isinstance(self._assign(cq, self._request(job), used), str):
                return chosen
        return None

    async def _workload(self, job: JSON, status: JSON) -> None:
        meta = job["metadata"]
        name = f"job-{meta['name']}-{meta['uid'][:5]}"
        path = f"{API}/namespaces/{meta['namespace']}/workloads/{name}"
        body = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
                "metadata": {"name": name, "namespace": meta["namespace"],
                             "labels": {"kueue.x-k8s.io/job-uid": meta["uid"]},
                             "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                                  "name": meta["name"], "uid": meta["uid"],
                                                  "controller": True,
                                                  "blockOwnerDeletion": True}]},
                "spec": {"queueName": meta["labels"][QUEUE_LABEL],
                         "priority": self._priority(job),
                         "podSets": [{"name": "main",
                                      "count": job["spec"].get("parallelism", 1),
                                      "template": job["spec"]["template"]}]}}
        try:
            await self.client.create(f"{API}/namespaces/{meta['namespace']}/workloads", body)
        except ApiFailure as exc:
            if exc.status != 409:
                raise
        await self.client.replace_status(path, status)

    @staticmethod
    def _condition(type_: str, value: str, reason: str, message: str) -> JSON:
        return {"type": type_, "status": value, "reason": reason, "message": message,
                "lastTransitionTime": now(), "observedGeneration": 1}

    async def _pending(self, job: JSON, message: str) -> None:
        uid = job["metadata"]["uid"]
        if self._pending_msg.get(uid) == message:
            return
        self._pending_msg[uid] = message
        await self._workload(job, {"conditions": [
            self._condition("QuotaReserved", "False", "Pending", message)]})

    async def _admit(self, job: JSON, cq: str, flavors: dict[str, str], usage: Usage) -> None:
        uid = job["metadata"]["uid"]
        self.admitted[uid] = (cq, flavors, usage)
        self._pending_msg.pop(uid, None)
        template = copy.deepcopy(job["spec"]["template"])
        pod_spec = template["spec"]
        for flavor_name in sorted(set(flavors.values())):
            flavor = self.flavors.cache.get(("", flavor_name)) or {"spec": {}}
            if flavor["spec"].get("nodeLabels"):
                pod_spec["nodeSelector"] = {**(pod_spec.get("nodeSelector") or {}),
                                            **flavor["spec"]["nodeLabels"]}
            current = pod_spec.get("tolerations") or []
            extra = [t for t in flavor["spec"].get("tolerations") or [] if t not in current]
            if extra:
                pod_spec["tolerations"] = current + extra
        resource_usage = {r: _fmt(n) for (_, r), n in usage.items()}
        await self._workload(job, {
            "admission": {"clusterQueue": cq, "podSetAssignments": [
                {"name": "main", "flavors": flavors, "resourceUsage": resource_usage,
                 "count": job["spec"].get("parallelism", 1)}]},
            "conditions": [self._condition("QuotaReserved", "True", "QuotaReserved",
                                           f"Quota reserved in ClusterQueue {cq}"),
                           self._condition("Admitted", "True", "Admitted",
                                           "The workload is admitted")]})
        try:
            await self.client.request("PATCH", path_of(job), {"spec": {
                "suspend": False, "template": template}},
                content_type="application/merge-patch+json")
        except ApiFailure as exc:
            self.admitted.pop(uid, None)
            if exc.status != 404:
                raise

    async def _evict(self, victim: JSON, by: JSON) -> None:
        uid = victim["metadata"]["uid"]
        self.admitted.pop(uid, None)
        message = (f"Preempted to accommodate a workload (UID: {by['metadata']['uid']}) "
                   "due to prioritization in the ClusterQueue")
        self._pending_msg[uid] = message
        await self._workload(victim, {"conditions": [
            self._condition("Evicted", "True", "Preempted", message),
            self._condition("QuotaReserved", "False", "Pending", message)]})
        await self.client.request("PATCH", path_of(victim), {"spec": {"suspend": True}},
                                  content_type="application/merge-patch+json")
