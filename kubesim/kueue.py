"""A Kueue stand-in: quota-based admission of suspended Jobs queued with the
``kueue.x-k8s.io/queue-name`` label, the way Kueue's job integration behaves, and of plain
queued pods (notebooks), the way its pod integration does.

For each queued Job or pod it keeps a ``Workload`` (owned by it); a Workload is admitted when
its whole pod set (parallelism x requests, all workers at once) fits the nominal quota of a
flavor of its ClusterQueue (flavors tried in order); admission unsuspends the Job (a pod: removes
its ``kueue.x-k8s.io/admission`` scheduling gate, which the emulator's webhook put on it) and
injects the flavor's ``nodeLabels`` / ``tolerations``. A workload's priority is its
``kueue.x-k8s.io/priority-class`` label's WorkloadPriorityClass value, else its pods'
PriorityClass value. Higher-priority workloads are admitted first and, if the ClusterQueue's
``preemption.withinClusterQueue`` is ``LowerPriority``, evict lower-priority admitted ones
(their Job is suspended again, their pod deleted; the Workload gets ``Evicted``). Pending
workloads carry Kueue's message (``couldn't assign flavors to pod set main: insufficient quota
for nvidia.com/gpu in flavor a100, 2 more needed``); their positions are served by
:mod:`.kueue_visibility`. Each ClusterQueue's status says its quota in use per flavor and
resource (``flavorsReservation``, ``flavorsUsage``) and its pending and admitted workload
counts, as Kueue's does. Not emulated: cohorts, borrowing, fair sharing, LimitRanges,
admission checks, pod groups.

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
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
GATE = "kueue.x-k8s.io/admission"
API = "/apis/kueue.x-k8s.io/v1beta2"

#: Quota used per (flavor, resource).
Usage = dict[tuple[str, str], Decimal]


def _fmt(amount: Decimal) -> str:
    return str(int(amount)) if amount == int(amount) else str(amount)


class KueueController:
    def __init__(self, url: str) -> None:
        self.client = HarnessClient(url, "kueue")
        self.jobs = Informer(self.client, "/apis/batch/v1/jobs", self._changed)
        self.pods = Informer(self.client, "/api/v1/pods", self._changed)
        self.workload_classes = Informer(self.client, f"{API}/workloadpriorityclasses",
                                         self._changed)
        self.local = Informer(self.client, f"{API}/localqueues", self._changed)
        self.cluster = Informer(self.client, f"{API}/clusterqueues", self._changed)
        self.flavors = Informer(self.client, f"{API}/resourceflavors", self._changed)
        self.classes = Informer(self.client, "/apis/scheduling.k8s.io/v1/priorityclasses",
                                self._changed)
        # job uid -> (cluster queue, {resource: flavor}, usage per (flavor, resource))
        self.admitted: dict[str, tuple[str, dict[str, str], Usage]] = {}
        self._pending_msg: dict[str, str] = {}
        #: Evicted and not admitted again: its Workload keeps ``Evicted`` while it waits.
        self._evicted: dict[str, str] = {}
        #: Each ClusterQueue's status as last written (written again only when it changes).
        self._cq_status: dict[str, JSON] = {}
        self._dirty = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        informers = (self.jobs, self.pods, self.local, self.cluster, self.flavors,
                     self.classes, self.workload_classes)
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

    def _priority_ref(self, obj: JSON) -> tuple[int, JSON | None]:
        """The workload's priority and where it comes from (Workload ``priorityClassRef``)."""
        wpc = (obj["metadata"].get("labels") or {}).get(PRIORITY_LABEL)
        found = self.workload_classes.cache.get(("", wpc)) if wpc else None
        if found is not None:
            return int(found.get("value", 0)), {"group": "kueue.x-k8s.io",
                                                "kind": "WorkloadPriorityClass", "name": wpc}
        name = _pod_spec(obj).get("priorityClassName")
        pc = self.classes.cache.get(("", name)) if name else None
        if pc is None:
            return 0, None
        return int(pc.get("value", 0)), {"group": "scheduling.k8s.io", "kind": "PriorityClass",
                                         "name": name}

    def _priority(self, obj: JSON) -> int:
        return self._priority_ref(obj)[0]

    @staticmethod
    def _request(obj: JSON) -> dict[str, Decimal]:
        per_pod = pod_requests({"spec": _pod_spec(obj)})
        count = _count(obj)
        return {k: v * count for k, v in per_pod.items() if v}

    def _queued(self) -> list[JSON]:
        everything = [*self.jobs.cache.values(), *self.pods.cache.values()]
        live = {o["metadata"]["uid"] for o in everything}
        for uid in [u for u in self.admitted if u not in live]:
            del self.admitted[uid]
        for uid in [u for u in self._evicted if u not in live]:
            del self._evicted[uid]
        out = []
        for obj in everything:
            meta = obj["metadata"]
            if QUEUE_LABEL not in (meta.get("labels") or {}):
                continue
            if _is_pod(obj) and meta.get("ownerReferences"):
                continue  # a queued Job's pod: the Job is the workload
            if _done(obj):
                self.admitted.pop(meta["uid"], None)
                continue
            if meta.get("deletionTimestamp") and meta["uid"] not in self.admitted:
                continue
            out.append(obj)
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
        waiting: dict[str, int] = {}  # pending workloads per ClusterQueue, for its status
        try:
            await self._admit_pending(pending, waiting)
        finally:
            await self._cluster_queue_statuses(waiting)

    async def _admit_pending(self, pending: list[JSON], waiting: dict[str, int]) -> None:
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
                    waiting[name] = waiting.get(name, 0) + 1
                    await self._pending(job, result)
                    continue
                for victim in victims:
                    await self._evict(victim, job)
                result = self._assign(cq, self._request(job), self._usage(name))
                if isinstance(result, str):
                    waiting[name] = waiting.get(name, 0) + 1
                    await self._pending(job, result)
                    continue
            await self._admit(job, name, *result)

    async def _cluster_queue_statuses(self, waiting: dict[str, int]) -> None:
        """Each ClusterQueue's status as Kueue keeps it: per flavor of its resource groups,
        each covered resource's quota in use (``flavorsReservation`` and ``flavorsUsage``,
        ``total`` and ``borrowed``: no cohorts here, so never borrowed), and its workload
        counts. Written only when it changed (the write is watched, as every change is)."""
        for cq in list(self.cluster.cache.values()):
            name = cq["metadata"]["name"]
            used = self._usage(name)
            flavors = []
            for group in cq["spec"].get("resourceGroups") or []:
                for flavor in group.get("flavors") or []:
                    flavors.append({"name": flavor["name"], "resources": [
                        {"name": r, "total": _fmt(used.get((flavor["name"], r), Decimal(0))),
                         "borrowed": "0"}
                        for r in group.get("coveredResources") or []]})
            admitted = sum(1 for q, _, _ in self.admitted.values() if q == name)
            status: JSON = {"flavorsReservation": flavors, "flavorsUsage": copy.deepcopy(flavors),
                            "pendingWorkloads": waiting.get(name, 0),
                            "reservingWorkloads": admitted, "admittedWorkloads": admitted}
            if self._cq_status.get(name) == status:
                continue
            await self.client.replace_status(f"{API}/clusterqueues/{name}", status)
            self._cq_status[name] = status

    def _victims(self, cq: JSON, job: JSON) -> list[JSON] | None:
        policy = ((cq["spec"].get("preemption") or {}).get("withinClusterQueue") or "Never")
        if policy == "Never":
            return None
        prio = self._priority(job)
        name = cq["metadata"]["name"]
        candidates = sorted((j for j in [*self.jobs.cache.values(), *self.pods.cache.values()]
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
        pod = _is_pod(job)
        name = f"{'pod' if pod else 'job'}-{meta['name']}-{meta['uid'][:5]}"
        path = f"{API}/namespaces/{meta['namespace']}/workloads/{name}"
        priority, ref = self._priority_ref(job)
        template = ({"metadata": {"labels": meta.get("labels") or {}},
                     "spec": {k: v for k, v in job["spec"].items() if k != "nodeName"}}
                    if pod else job["spec"]["template"])
        spec: JSON = {"queueName": meta["labels"][QUEUE_LABEL], "priority": priority,
                      "podSets": [{"name": "main", "count": _count(job),
                                   "template": template}]}
        if ref is not None:
            spec["priorityClassRef"] = ref
        owner = {"apiVersion": "v1", "kind": "Pod"} if pod else {"apiVersion": "batch/v1",
                                                                   "kind": "Job"}
        body = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
                "metadata": {"name": name, "namespace": meta["namespace"],
                             "labels": {f"kueue.x-k8s.io/{'pod' if pod else 'job'}-uid":
                                        meta["uid"]},
                             "ownerReferences": [{**owner,
                                                  "name": meta["name"], "uid": meta["uid"],
                                                  "controller": True,
                                                  "blockOwnerDeletion": True}]},
                "spec": spec}
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
        conditions = [self._condition("QuotaReserved", "False", "Pending", message)]
        if uid in self._evicted:
            conditions.insert(0, self._condition("Evicted", "True", "Preempted",
                                                 self._evicted[uid]))
        await self._workload(job, {"conditions": conditions})

    async def _admit(self, job: JSON, cq: str, flavors: dict[str, str], usage: Usage) -> None:
        uid = job["metadata"]["uid"]
        self.admitted[uid] = (cq, flavors, usage)
        self._pending_msg.pop(uid, None)
        self._evicted.pop(uid, None)
        pod_spec = copy.deepcopy(_pod_spec(job))
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
                 "count": _count(job)}]},
            "conditions": [self._condition("QuotaReserved", "True", "QuotaReserved",
                                           f"Quota reserved in ClusterQueue {cq}"),
                           self._condition("Admitted", "True", "Admitted",
                                           "The workload is admitted")]})
        if _is_pod(job):
            gates = [g for g in pod_spec.get("schedulingGates") or [] if g.get("name") != GATE]
            patch: JSON = {"spec": {"schedulingGates": gates, **{
                k: pod_spec[k] for k in ("nodeSelector", "tolerations") if k in pod_spec}}}
        else:
            template = copy.deepcopy(job["spec"]["template"])
            template["spec"] = pod_spec
            patch = {"spec": {"suspend": False, "template": template}}
        try:
            await self.client.request("PATCH", path_of(job), patch,
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
        self._evicted[uid] = message
        await self._workload(victim, {"conditions": [
            self._condition("Evicted", "True", "Preempted", message),
            self._condition("QuotaReserved", "False", "Pending", message)]})
        try:
            if _is_pod(victim):  # a plain pod stops by going away
                await self.client.request("DELETE", path_of(victim))
            else:
                await self.client.request("PATCH", path_of(victim), {"spec": {"suspend": True}},
                                          content_type="application/merge-patch+json")
        except ApiFailure as exc:
            if exc.status != 404:
                raise


def _is_pod(obj: JSON) -> bool:
    return "template" not in (obj.get("spec") or {})


def _pod_spec(obj: JSON) -> JSON:
    spec: JSON = obj["spec"] if _is_pod(obj) else obj["spec"]["template"]["spec"]
    return spec


def _count(obj: JSON) -> int:
    return 1 if _is_pod(obj) else int(obj["spec"].get("parallelism", 1))


def _done(obj: JSON) -> bool:
    if _is_pod(obj):
        return (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed")
    return _finished(obj) is not None
