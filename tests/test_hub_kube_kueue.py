"""A GPU notebook queued in Kueue (``kueue.queueNotebooks``), end to end: the real JupyterHub
configured from the chart (as in ``tests/test_hub_kube_mode.py``) spawns the pod on the API
emulator, whose Kueue gates it until the team's quota has room; the spawn page says where it
stands in the queue (Kueue's visibility API, read under the chart's hub Role) and the server
starts once the quota frees."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from kubesim import KubeCluster
from tests.chart_security import HUB_ACCOUNT
from tests.test_hub_kube_config import RELEASE, cluster_prefix, example_values, find, render
from tests.test_hub_kube_mode import ChartHub, chart_hub  # noqa: F401  (fixture)
from tests.test_kubernetes_backend import RESTRICTED_CONTAINER, RESTRICTED_POD

KUEUE_KINDS = ("WorkloadPriorityClass", "ResourceFlavor", "ClusterQueue", "LocalQueue")


@pytest.fixture
def chart_values() -> dict[str, Any]:
    """The example GPU lab with notebooks queued in Kueue, its quota one T4."""
    values = example_values()
    values["kueue"]["queueNotebooks"] = True
    for gpu in values["gpuTypes"]:
        gpu["quota"] = 1 if gpu["name"] == "t4" else 0
    return values


def install_kueue(kube: KubeCluster, values: dict[str, Any]) -> None:
    """The chart's Kueue objects, and the part of its hub Role that queued notebooks add (the
    fixture installed the example's RBAC, whose notebooks are not queued)."""
    objects = render(values, namespace=kube.namespace)
    for obj in objects:
        if obj["kind"] in KUEUE_KINDS:
            kube.create(obj)
    role = find(objects, "Role", f"{RELEASE}-hub")
    extra = [r for r in role["rules"] if "visibility.kueue.x-k8s.io" in r["apiGroups"]]
    assert extra == [{"apiGroups": ["visibility.kueue.x-k8s.io"],
                      "resources": ["localqueues/pendingworkloads"], "verbs": ["get"]}]
    name = f"{RELEASE}-hub-kueue"
    kube.apply([
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": name}, "rules": extra},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": name},
         "subjects": [{"kind": "ServiceAccount", "name": HUB_ACCOUNT,
                       "namespace": kube.namespace}],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}}])


def holder(kube: KubeCluster, released: Path) -> dict[str, Any]:
    """Someone's queued T4 notebook, holding the team's whole GPU quota until ``released``."""
    wait = f"import os, time\nwhile not os.path.exists({str(released)!r}):\n    time.sleep(0.1)\n"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "jupyter-ann", "labels": {
                "kueue.x-k8s.io/queue-name": RELEASE,
                "kueue.x-k8s.io/priority-class":
                    f"{cluster_prefix(kube.namespace)}-notebook-1000"}},
            "spec": {"restartPolicy": "Never", "securityContext": RESTRICTED_POD,
                     "nodeSelector": {"nvidia.com/gpu.product": "Tesla-T4"},
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                     "containers": [{"name": "nb", "image": "notebook",
                                     "securityContext": RESTRICTED_CONTAINER,
                                     "command": ["python", "-c", wait],
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


@pytest.mark.timeout(300)
def test_a_queued_gpu_notebook_shows_its_place_and_starts_when_the_quota_frees(
        chart_hub: ChartHub, kube: KubeCluster,  # noqa: F811
        chart_values: dict[str, Any]) -> None:
    hub = chart_hub
    install_kueue(kube, chart_values)
    released = kube.data_dir / "released"
    kube.create(holder(kube, released))
    hub.wait(lambda: (kube.get("pods", "jupyter-ann") or {}).get("status", {}).get(
        "phase") == "Running", 60, "the other notebook to hold the quota")

    assert hub.api("POST", "users/bob").status_code == 201
    r = hub.api("POST", "users/bob/server", json={"profile": "t4-1"})
    assert r.status_code == 202, r.text  # pending: it waits, no refusal
    events: list[dict[str, Any]] = []

    def follow() -> None:
        # From the hub itself: the proxy here gives up on a stream after its timeout.
        url = f"{hub.env['T_HUB_CONNECT_URL']}/hub/api/users/bob/server/progress"
        with httpx.stream("GET", url, headers=hub.auth, timeout=240) as stream:
            for line in stream.iter_lines():
                if line.startswith("data:"):
                    events.append(json.loads(line[5:]))
                    if events[-1].get("ready") or events[-1].get("failed"):
                        return

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    cq = cluster_prefix(kube.namespace)
    place = (f"Waiting for the team's GPU quota (Kueue): 1st in ClusterQueue {cq}; it starts "
             "when running work ends or is preempted")
    hub.wait(lambda: any(e.get("message") == place for e in events), 90,
             "the spawn page to show the notebook's place in the queue")
    pod = kube.get("pods", "jupyter-bob")
    assert pod is not None and pod["spec"]["schedulingGates"] == [
        {"name": "kueue.x-k8s.io/admission"}]  # Kueue holds it, not the scheduler
    assert pod["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == f"{cq}-notebook-1000"

    released.write_text("")  # the other notebook stops: the quota frees
    reader.join(timeout=200)
    assert events and events[-1].get("ready"), events
    started = kube.get("pods", "jupyter-bob")
    assert started is not None and started["spec"]["nodeName"] == "gpu-t4-0"
    assert not started["spec"].get("schedulingGates")
    assert ("visibility.kueue.x-k8s.io", "localqueues/pendingworkloads", "get") in (
        kube.exercised(HUB_ACCOUNT))


def test_queue_message_names_the_place_only_while_pending() -> None:
    from hub.kueue_wait import queue_message

    summary = {"items": [
        {"metadata": {"ownerReferences": [{"kind": "Pod", "name": "jupyter-ann"}]},
         "positionInClusterQueue": 0},
        {"metadata": {"ownerReferences": [{"kind": "Job", "name": "jupyter-bob"}]},
         "positionInClusterQueue": 1},
        {"metadata": {"ownerReferences": [{"kind": "Pod", "name": "jupyter-bob"}]},
         "positionInClusterQueue": 2}]}
    assert queue_message("jupyter-bob", summary, "team-a") == (
        "Waiting for the team's GPU quota (Kueue): 3rd in ClusterQueue team-a; it starts when "
        "running work ends or is preempted")
    assert queue_message("jupyter-cy", summary, "team-a") is None  # admitted, or not queued
    assert "1st in the queue" in (queue_message("jupyter-ann", summary, "") or "")
