"""Kueue's on-demand visibility API (``visibility.kueue.x-k8s.io/v1beta1``), read from the
emulator's store: the pending workloads of a LocalQueue or a ClusterQueue, in the order the
ClusterQueue admits them, each with its position in both.

Why here and not in :mod:`.kueue`: Kueue serves this API itself (an aggregated API server
behind the cluster's), so it answers from what is stored, the Workloads :mod:`.kueue` keeps,
without waiting for a controller pass. The order is the stand-in's: priority, then age.

    GET /apis/visibility.kueue.x-k8s.io/v1beta1/namespaces/NS/localqueues/LQ/pendingworkloads
    GET /apis/visibility.kueue.x-k8s.io/v1beta1/clusterqueues/CQ/pendingworkloads
"""

from __future__ import annotations

from .objects import JSON
from .resources import KUEUE, lookup
from .store import Store

GROUP = "visibility.kueue.x-k8s.io"
VERSION = "v1beta1"


def _conditions(workload: JSON) -> dict[str, str]:
    return {c.get("type", ""): c.get("status", "")
            for c in (workload.get("status") or {}).get("conditions") or []}


def _pending(workload: JSON) -> bool:
    conds = _conditions(workload)
    return (not (workload.get("status") or {}).get("admission")
            and conds.get("QuotaReserved") != "True" and conds.get("Finished") != "True")


def _cluster_queue_of(store: Store, workload: JSON) -> str | None:
    local = lookup(KUEUE, "v1beta2", "localqueues")
    assert local is not None
    lq = store.get(local, workload["metadata"]["namespace"], workload["spec"]["queueName"])
    return None if lq is None else str(lq["spec"].get("clusterQueue", ""))


def _queue(store: Store, cluster_queue: str) -> list[JSON]:
    """The ClusterQueue's pending workloads, first to be admitted first."""
    workloads = lookup(KUEUE, "v1beta2", "workloads")
    assert workloads is not None
    pending = [w for w in store.list(workloads, None)
               if _pending(w) and _cluster_queue_of(store, w) == cluster_queue]
    pending.sort(key=lambda w: (-int(w["spec"].get("priority") or 0),
                                w["metadata"]["creationTimestamp"], w["metadata"]["name"]))
    return pending


def _summary(items: list[JSON]) -> JSON:
    return {"kind": "PendingWorkloadsSummary", "apiVersion": f"{GROUP}/{VERSION}",
            "metadata": {}, "items": items}


def _item(workload: JSON, in_cq: int, in_lq: int) -> JSON:
    meta = workload["metadata"]
    return {"metadata": {k: meta[k] for k in ("name", "namespace", "creationTimestamp",
                                              "ownerReferences") if k in meta},
            "priority": int(workload["spec"].get("priority") or 0),
            "localQueueName": workload["spec"]["queueName"],
            "positionInClusterQueue": in_cq, "positionInLocalQueue": in_lq}


def _positions(queue: list[JSON]) -> list[JSON]:
    seen: dict[tuple[str, str], int] = {}
    out = []
    for i, w in enumerate(queue):
        key = (w["metadata"]["namespace"], w["spec"]["queueName"])
        out.append(_item(w, i, seen.get(key, 0)))
        seen[key] = seen.get(key, 0) + 1
    return out


def local_queue_pending(store: Store, namespace: str, name: str) -> JSON | None:
    """The LocalQueue's pending workloads (None: no such LocalQueue)."""
    local = lookup(KUEUE, "v1beta2", "localqueues")
    assert local is not None
    lq = store.get(local, namespace, name)
    if lq is None:
        return None
    items = _positions(_queue(store, str(lq["spec"].get("clusterQueue", ""))))
    return _summary([i for i in items if i["metadata"]["namespace"] == namespace
                     and i["localQueueName"] == name])


def cluster_queue_pending(store: Store, name: str) -> JSON | None:
    cluster = lookup(KUEUE, "v1beta2", "clusterqueues")
    assert cluster is not None
    if store.get(cluster, "", name) is None:
        return None
    return _summary(_positions(_queue(store, name)))
