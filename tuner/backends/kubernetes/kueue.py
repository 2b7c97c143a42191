"""What Kueue says of an attempt's Job, in words for people: pure functions over the API's JSON
of its ``Workload`` (``kueue.x-k8s.io/v1beta2``) and of the visibility API's pending workloads
(``visibility.kueue.x-k8s.io/v1beta1``), used by the Workload watch in :mod:`.backend`.

- :func:`workload_job`: the Job a Workload stands for (its owner).
- :func:`eviction`: why Kueue evicted an admitted Workload (``Evicted`` condition), or None.
- :func:`waiting_reason`: why a Workload waits (``QuotaReserved`` False), with its ClusterQueue
  and its place in the queue: ``waiting for quota in ClusterQueue team-a: 3rd in queue
  (couldn't assign flavors ...)``.
- :func:`positions`: Job name -> 0-based position in the ClusterQueue, from the visibility
  API's ``PendingWorkloadsSummary``.
"""

from __future__ import annotations

from typing import Any

from tunehub_base.ordinal import ordinal

API_GROUP = "kueue.x-k8s.io"
API_VERSION = "v1beta2"
VISIBILITY_GROUP = "visibility.kueue.x-k8s.io"
VISIBILITY_VERSION = "v1beta1"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"


def _conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c.get("type", ""): c for c in (obj.get("status") or {}).get("conditions") or []}


def _owner_job(meta: dict[str, Any]) -> str | None:
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == "Job" and str(ref.get("apiVersion", "")).startswith("batch/"):
            return str(ref.get("name"))
    return None


def workload_job(workload: dict[str, Any]) -> str | None:
    """The name of the Job a Workload was made for; None for other owners (notebook pods)."""
    return _owner_job(workload.get("metadata") or {})


def admitted(workload: dict[str, Any]) -> bool:
    return _conditions(workload).get("Admitted", {}).get("status") == "True"


def eviction(workload: dict[str, Any]) -> str | None:
    """Kueue's message when it evicted the Workload (preempted by a higher priority, reclaimed
    by its cohort...); None while it is not evicted."""
    evicted = _conditions(workload).get("Evicted")
    if not evicted or evicted.get("status") != "True":
        return None
    return str(evicted.get("message") or evicted.get("reason") or "evicted")


def waiting_reason(workload: dict[str, Any], queue: str, position: int | None) -> str | None:
    """Why a pending Workload waits, or None once it holds quota. ``queue``: its
    ClusterQueue's name (``ClusterQueue NAME``) or, not known, its LocalQueue's;
    ``position``: 0-based, from the visibility API (None: not known)."""
    conds = _conditions(workload)
    reserved = conds.get("QuotaReserved")
    if admitted(workload) or (reserved and reserved.get("status") == "True"):
        return None
    reason = f"waiting for quota in {queue}"
    if position is not None:
        reason += f": {ordinal(position + 1)} in queue"
    message = (reserved or {}).get("message")
    return f"{reason} ({message})" if message else reason


def positions(summary: dict[str, Any]) -> dict[str, int]:
    """Job name -> position in its ClusterQueue (0: next), from a ``PendingWorkloadsSummary``."""
    out = {}
    for item in summary.get("items") or []:
        job = _owner_job(item.get("metadata") or {})
        if job is not None:
            out[job] = int(item.get("positionInClusterQueue", 0))
    return out
