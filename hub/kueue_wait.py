"""A queued notebook's place in Kueue's queue, for the spawn progress page.

With ``kueue.queueNotebooks`` a notebook pod waits gated until Kueue admits it from the team's
quota; the scheduler says nothing meanwhile (no ``FailedScheduling``), so without this the
person sees a silent spinner. Kueue's visibility API (``visibility.kueue.x-k8s.io/v1beta1``,
``localqueues/NAME/pendingworkloads``) gives each pending workload its position; the hub's Role
may ``get`` exactly that. Positions are not watchable: the spawner asks again every few
seconds while its pod waits (:meth:`hub.kube_spawner.TunehubKubeSpawner.progress`).
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from tunehub_base.ordinal import ordinal

VISIBILITY = "/apis/visibility.kueue.x-k8s.io/v1beta1"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def queue_message(pod_name: str, summary: dict[str, Any], cluster_queue: str) -> str | None:
    """What the spawn page says while ``pod_name`` waits in the queue ``summary`` describes
    (a ``PendingWorkloadsSummary``); None when it is not pending there (admitted, or gone)."""
    for item in summary.get("items") or []:
        owners = (item.get("metadata") or {}).get("ownerReferences") or []
        if any(o.get("kind") == "Pod" and o.get("name") == pod_name for o in owners):
            where = f"ClusterQueue {cluster_queue}" if cluster_queue else "the queue"
            place = ordinal(int(item.get("positionInClusterQueue", 0)) + 1)
            return (f"Waiting for the team's GPU quota (Kueue): {place} in {where}; "
                    "it starts when running work ends or is preempted")
    return None


async def pending_workloads(api_client: Any, namespace: str, local_queue: str
                            ) -> dict[str, Any] | None:
    """The LocalQueue's pending workloads through kubernetes-asyncio's ``api_client``; None
    when Kueue does not serve them or the hub may not read them."""
    path = f"{VISIBILITY}/namespaces/{{namespace}}/localqueues/{{name}}/pendingworkloads"
    try:
        resp = await api_client.call_api(
            path, "GET", {"namespace": namespace, "name": local_queue},
            header_params={"Accept": "application/json"}, auth_settings=["BearerToken"],
            _return_http_data_only=True, _preload_content=False)
    except ApiException:
        return None
    try:
        body = await resp.read()
    finally:
        resp.release()
    if resp.status >= 400:
        return None
    return dict(json.loads(body))
