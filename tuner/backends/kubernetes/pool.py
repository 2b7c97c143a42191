"""The GPU pool as the cluster shows it, in the rows the pool view shows on one machine: pure
functions over the API's JSON (pods, Jobs, Kueue's ClusterQueue and Workloads, the visibility
API's pending workloads), read by :mod:`tuner.pool_sources.kubernetes`.

- :func:`pod_gpus`: the GPUs a pod asks for (its containers' requests or limits of the GPU
  resource).
- :func:`pod_holder`: who a pod is, from what tunehub already puts on it: a trial pod's sweep,
  trial and attempt labels (its person is its Job's owner annotation); a notebook pod's
  KubeSpawner annotations (the hub user and the server's name).
- :func:`holding`: a pod that holds GPUs now (bound to a node, not finished), as a pool row.
- :func:`flavor_rows`: each ResourceFlavor of the ClusterQueue that covers the GPU resource:
  its nominal quota and what Kueue says is in use (``status.flavorsUsage``).
- :func:`queue_rows`: the pending GPU Workloads, by their place in the ClusterQueue (Kueue's
  visibility API) and why they wait (their ``QuotaReserved`` condition).

Nothing here decides anything: Kueue does (see README, "The GPU pool on Kubernetes: Kueue").
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from tunehub_base.gpu_holders import Holder
from tuner.backends.kubernetes import kueue
from tuner.backends.kubernetes import manifests as m
from tuner.backends.kubernetes.job_pods import JOB_NAME_LABEL
from tuner.backends.kubernetes.settings import KubeSettings

#: What KubeSpawner writes on a notebook's pod (the user's name unescaped, unlike the label).
USER_ANNOTATION = "hub.jupyter.org/username"
SERVER_ANNOTATION = "hub.jupyter.org/servername"
COMPONENT_LABEL = "app.kubernetes.io/component"
#: The chart's KubeSpawner ``component_label`` (``hub/kube.py``).
NOTEBOOK_COMPONENT = "notebook"
FINISHED = ("Succeeded", "Failed")


def timestamp(text: Any) -> float | None:
    """An API timestamp (RFC 3339, ``...Z``) as seconds; None when absent or unreadable."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def quantity(value: Any) -> float:
    """A resource quantity the way GPUs are counted (``"2"``, ``2``, ``"0"``); what is not a
    plain number (``"500m"`` is no GPU count) reads as 0."""
    try:
        return float(Decimal(str(value)))
    except (InvalidOperation, ValueError):
        return 0.0


def _containers_gpus(spec: dict[str, Any], resource: str) -> int:
    total = 0.0
    for ctr in spec.get("containers") or []:
        res = ctr.get("resources") or {}
        wanted = (res.get("limits") or {}).get(resource, (res.get("requests") or {}).get(
            resource, 0))
        total += quantity(wanted)
    return int(total)


def pod_gpus(pod: dict[str, Any], resource: str) -> int:
    """GPUs the pod asks for: an extended resource is requested through its limits (its
    request, when given, must equal them)."""
    return _containers_gpus(pod.get("spec") or {}, resource)


def holds(pod: dict[str, Any], resource: str) -> bool:
    """The pod holds its GPUs: it asks for some, is bound to a node and has not finished (a
    pod still stopping holds them until it is gone)."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    return bool(spec.get("nodeName")) and status.get("phase") not in FINISHED and pod_gpus(
        pod, resource) > 0


def _int(text: Any) -> int | None:
    try:
        return int(str(text))
    except (TypeError, ValueError):
        return None


def pod_holder(pod: dict[str, Any], owners: dict[str, str]) -> Holder | None:
    """Who the pod is: a trial attempt (``owners``: Job name -> its owner annotation) or a
    notebook server; None for a pod that is neither (not one of tunehub's)."""
    meta = pod.get("metadata") or {}
    labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
    if labels.get(m.SWEEP_LABEL) and labels.get(m.TRIAL_LABEL):
        job = labels.get(JOB_NAME_LABEL) or labels.get("job-name") or ""
        return Holder.trial_attempt(
            owners.get(job, ""), _int(labels[m.SWEEP_LABEL]) or 0,
            _int(labels[m.TRIAL_LABEL]) or 0, _int(labels.get(m.ATTEMPT_LABEL)) or 0)
    if NOTEBOOK_COMPONENT in (labels.get(COMPONENT_LABEL), labels.get("component")):
        person = notes.get(USER_ANNOTATION) or labels.get(USER_ANNOTATION) or ""
        return Holder.notebook(str(person), str(notes.get(SERVER_ANNOTATION) or ""))
    return None


def job_holder(job: dict[str, Any]) -> Holder | None:
    """The trial attempt a Job runs (a queued Job has no pod yet), from its labels and its
    owner annotation."""
    meta = job.get("metadata") or {}
    fake_pod = {"metadata": {"labels": {**(meta.get("labels") or {}),
                                        JOB_NAME_LABEL: meta.get("name", "")}}}
    return pod_holder(fake_pod, job_owners([job]))


def job_owners(jobs: list[dict[str, Any]]) -> dict[str, str]:
    """Job name -> the person whose trial it runs (the annotation tunehub writes on it)."""
    return {j["metadata"]["name"]: str((j["metadata"].get("annotations") or {}).get(
        m.OWNER_ANNOTATION, "")) for j in jobs}


def workload_flavors(workloads: list[dict[str, Any]], resource: str) -> dict[str, str]:
    """The ResourceFlavor Kueue admitted each workload's GPUs in, by its owner's name (a Job,
    or a notebook's pod)."""
    out = {}
    for w in workloads:
        owner = _owner(w)
        for assignment in ((w.get("status") or {}).get("admission") or {}).get(
                "podSetAssignments") or []:
            flavor = (assignment.get("flavors") or {}).get(resource)
            if owner and flavor:
                out[owner[1]] = str(flavor)
    return out


def _owner(workload: dict[str, Any]) -> tuple[str, str] | None:
    for ref in (workload.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") in ("Job", "Pod"):
            return str(ref["kind"]), str(ref.get("name"))
    return None


def gpu_type(pod: dict[str, Any], settings: KubeSettings) -> str:
    """The GPU type of a pod's node as tunehub names it (``TUNEHUB_K8S_GPU_TYPES``), from the
    node selector Kueue's flavor or the trial's ``gpu_type`` put on it; "" when none."""
    product = ((pod.get("spec") or {}).get("nodeSelector") or {}).get(
        settings.gpu_names.product_label, "")
    known = settings.gpu_type(product) if product else None
    return known.name if known is not None else str(product)


def holding(pod: dict[str, Any], holder: Holder | None, flavor: str, resource: str,
            now: float) -> dict[str, Any]:
    """One pod holding GPUs, as a row of the pool view: ``gpu`` says what is held where
    (``2 x a100 on gpu-a100-0``), ``since`` when the pod started (``status.startTime``).
    What its GPUs do is added by the pool source, from the pod's own readings
    (:func:`tuner.pool_sources.kube_use.row_figures`)."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    since = timestamp((pod.get("status") or {}).get("startTime")) or timestamp(
        meta.get("creationTimestamp")) or now
    count = pod_gpus(pod, resource)
    return {"gpu": f"{count} x {flavor or 'GPU'} on {spec.get('nodeName')}", "state": "held",
            "gpus": count, "flavor": flavor or None, "node": spec.get("nodeName"),
            "pod": meta.get("name"), "uid": meta.get("uid"),
            "holder": None if holder is None else holder.view(),
            "since": since}


def flavor_rows(cluster_queue: dict[str, Any], resource: str) -> list[dict[str, Any]]:
    """Each flavor of the ClusterQueue covering ``resource``: ``nominal`` quota, ``used``
    (Kueue's ``flavorsUsage``), ``borrowed`` from the cohort, and ``free``."""
    usage: dict[str, dict[str, Any]] = {}
    for flavor in (cluster_queue.get("status") or {}).get("flavorsUsage") or []:
        for res in flavor.get("resources") or []:
            if res.get("name") == resource:
                usage[str(flavor.get("name"))] = res
    rows = []
    for group in (cluster_queue.get("spec") or {}).get("resourceGroups") or []:
        if resource not in (group.get("coveredResources") or []):
            continue
        for flavor in group.get("flavors") or []:
            quota: dict[str, Any] = next(
                (r for r in flavor.get("resources") or [] if r.get("name") == resource), {})
            name = str(flavor.get("name"))
            nominal = quantity(quota.get("nominalQuota", 0))
            used = quantity((usage.get(name) or {}).get("total", 0))
            rows.append({"flavor": name, "resource": resource, "nominal": nominal,
                         "used": used, "borrowed": quantity((usage.get(name) or {}).get(
                             "borrowed", 0)),
                         "free": max(0.0, nominal - used)})
    return rows


def queue_rows(workloads: list[dict[str, Any]], places: dict[str, int], queue: str,
               who: dict[str, Holder | None], resource: str,
               priorities: dict[str, str]) -> list[dict[str, Any]]:
    """The pending Workloads asking for GPUs, in the ClusterQueue's order (``places``:
    Workload name -> 0-based position from the visibility API; without one, after those with
    one, oldest first), each with who, what, how many GPUs, its priority, since when and
    Kueue's reason. ``who``: owner name -> holder; ``priorities``: WorkloadPriorityClass ->
    the sweep priority it stands for."""
    rows: list[dict[str, Any]] = []
    for w in workloads:
        meta, spec = w.get("metadata") or {}, w.get("spec") or {}
        gpus = sum(_containers_gpus((ps.get("template") or {}).get("spec") or {}, resource)
                   * int(ps.get("count") or 1) for ps in spec.get("podSets") or [])
        place = places.get(str(meta.get("name")))
        reason = kueue.waiting_reason(w, queue, place)
        owner = _owner(w)
        if not gpus or reason is None or owner is None or (w.get("status") or {}).get(
                "admission"):
            continue
        holder = who.get(owner[1])
        ref = (spec.get("priorityClassRef") or {}).get("name", "")
        rows.append({"position": place, "person": holder.person if holder else "",
                     "kind": holder.kind if holder else owner[0].lower(),
                     "what": holder.what if holder else f"{owner[0]} {owner[1]}",
                     "gpus": gpus,
                     "priority": priorities.get(ref) if holder and holder.kind == "trial"
                     else None,
                     "since": timestamp(meta.get("creationTimestamp")), "reason": reason,
                     "workload": meta.get("name")})
    rows.sort(key=lambda r: (r["position"] is None, r["position"] or 0, r["since"] or 0))
    for i, row in enumerate(rows, start=1):
        row["position"] = i if row["position"] is None else row["position"] + 1
    return rows


def places(summary: dict[str, Any] | None) -> dict[str, int]:
    """Workload name -> 0-based position in its ClusterQueue, from the visibility API's
    ``PendingWorkloadsSummary`` (none: no positions known)."""
    return {str(i["metadata"]["name"]): int(i.get("positionInClusterQueue", 0))
            for i in (summary or {}).get("items") or [] if (i.get("metadata") or {}).get("name")}


def person_rows(rows: list[dict[str, Any]], queue: list[dict[str, Any]],
                cluster_queue: dict[str, Any] | None, account: str,
                quota: int | None) -> list[dict[str, Any]]:
    """Each person holding or waiting for GPUs, in the pool's ``shares`` shape: GPUs held and
    waiting, and what they share. On a cluster a person has no quota of their own: the team
    shares its ClusterQueue's (``account``, ``fair_share_gpus``: the queue's nominal GPUs),
    weighed against other teams by the queue's fair-sharing weight; ``share`` is the part of
    that quota the person holds, ``max_gpus`` None (no per-person cap: Kueue caps the queue)."""
    weight = 1.0
    raw = (((cluster_queue or {}).get("spec") or {}).get("fairSharing") or {}).get("weight")
    try:
        weight = float(raw) if raw is not None else 1.0
    except (TypeError, ValueError):
        pass
    held: dict[str, int] = {}
    waiting: dict[str, int] = {}
    for row in rows:
        person = str((row.get("holder") or {}).get("person") or "")
        if person:
            held[person] = held.get(person, 0) + int(row["gpus"])
    for entry in queue:
        if entry.get("person"):
            waiting[entry["person"]] = waiting.get(entry["person"], 0) + int(entry["gpus"])
    return [{"person": person, "account": account, "held_gpus": held.get(person, 0),
             "waiting_gpus": waiting.get(person, 0), "weight": weight,
             "share": round(held.get(person, 0) / quota, 3) if quota else 0.0,
             "fair_share_gpus": quota or 0, "max_gpus": None}
            for person in sorted(set(held) | set(waiting))]
