"""Idle GPUs given back on Kubernetes (issue #26): the chart's hub spawns a GPU notebook pod on
the Kubernetes API emulator, the pod's server reads the GPU the device plugin gave it through the
real ``nvidia-ml-py`` on the NVML stand-in (which the kubelet stand-in puts in GPU containers, as
NVIDIA's container toolkit puts the driver's), and with the chart's ``gpuReclaim`` settings an
idle GPU is warned about in the person's file browser, then the server is stopped: its pod is
deleted, so the node's GPU is free for others, and the reason is kept for the person.

The local half (warnings in JupyterLab, busy, mid-cell, exempt and lost GPUs kept) is
``test_gpu_reclaim``; what differs in a pod is how the server finds its GPUs (every GPU NVML
shows it, ``NVIDIA_VISIBLE_DEVICES`` set by the device plugin, not ``CUDA_VISIBLE_DEVICES``)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from hub.singleuser.gpu_reclaim import NOTICE
from kubesim import KubeCluster
from tests import test_gpu_usage
from tests.nvml_standin import GiB, StandIn
from tests.test_hub_kube_config import example_values
from tests.test_hub_kube_mode import ChartHub, chart_hub  # noqa: F401 -- the fixture

pytestmark = pytest.mark.slow

# The stand-in built once per session, with this test's figures file (test_gpu_usage's fixtures).
nvml_library, standin = test_gpu_usage.nvml_library, test_gpu_usage.standin

WARN, RECLAIM = 3, 3  # seconds: unused before the warning, then before the stop


@pytest.fixture
def chart_values() -> dict[str, Any]:
    """The example GPU lab, reclaiming idle GPUs within seconds."""
    values = example_values()
    values["gpuReclaim"] = {"warnAfter": WARN, "reclaimAfter": RECLAIM, "sampleSeconds": 0.5,
                            "exempt": ["group:research"]}
    return values


def _report(hub: ChartHub, user: str) -> dict[str, Any]:
    r = hub.api("GET", f"tunehub/gpu-use/{user}")
    assert r.status_code == 200, r.text
    return dict(r.json())


def _notice(hub: ChartHub, user: str) -> int:
    return httpx.get(f"{hub.url}user/{user}/api/contents/{NOTICE}", headers=hub.auth,
                     timeout=30).status_code


@pytest.mark.timeout(300)
def test_idle_gpu_notebook_pod_is_warned_then_stopped_and_its_gpu_freed(
        chart_hub: ChartHub, kube: KubeCluster, standin: StandIn) -> None:  # noqa: F811
    hub = chart_hub
    standin.set({"util": 90, "mem_used": GiB, "mem_total": 16 * GiB})  # in use while it starts
    kube.runtime.gpu_driver_env = standin.env
    # The chart's settings reached the hub: the policy every server is answered with.
    assert hub.api("POST", "users/ann").status_code == 201
    policy = _report(hub, "ann")["policy"]
    assert (policy["warn_after"], policy["reclaim_after"], policy["sample_seconds"]) == (
        WARN, RECLAIM, 0.5), policy
    assert policy["enabled"] is True
    # ... and the exempt list: a member of the research group is never reclaimed.
    assert hub.api("POST", "users/rex").status_code == 201
    assert hub.api("POST", "groups/research", json={"users": ["rex"]}).status_code == 201
    assert _report(hub, "rex")["policy"]["exempt"] is True

    r = hub.api("POST", "users/ann/server", json={"profile": "t4-1"})
    assert r.status_code in (201, 202), r.text
    hub.wait(lambda: (hub.server("ann") or {}).get("ready"), 120, "ann's GPU server")
    pod = kube.get("pods", "jupyter-ann")
    assert pod is not None and pod["spec"]["nodeName"] == "gpu-t4-0"
    assert str(pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]) == "1"

    # The pod's server measures the GPU its pod was given (no CUDA_VISIBLE_DEVICES in a pod:
    # every GPU NVML shows it) and reports it in use.
    hub.wait(lambda: _report(hub, "ann")["servers"].get("", {}).get("state") == "in use", 60,
             "ann's server to report its GPU in use")
    readings = _report(hub, "ann")["servers"][""]["readings"]
    assert [g["gpu"] for g in readings] == ["0"] and readings[0]["utilization"], readings
    assert _notice(hub, "ann") == 404

    # Unused: warned in the person's file browser, then stopped; the pod goes, and the node's
    # GPU with it.
    standin.set({"util": 0, "mem_used": GiB, "mem_total": 16 * GiB})
    hub.wait(lambda: _notice(hub, "ann") == 200, WARN + 60, "the idle-GPU notice")
    hub.wait(lambda: hub.server("ann") is None and kube.get("pods", "jupyter-ann") is None,
             RECLAIM + 60, "ann's idle GPU server and pod to be gone")
    use = _report(hub, "ann")
    assert use["servers"] == {}
    assert "give its GPUs back" in use["stopped"]["reason"], use
    assert "not used for" in use["stopped"]["reason"], use
