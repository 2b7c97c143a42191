"""Trial pods as a cluster operator wants them: a memory-backed ``/dev/shm`` when a pod holds
several GPUs (NCCL), and an ephemeral-storage request and limit (one trial filling a node's disk
is evicted alone), accepted by the Kubernetes schema and, through the chart, by Kueue's quota."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from tests.test_hub_kube_config import (
    NAMESPACE,
    RELEASE,
    cluster_prefix,
    example_values,
    find,
    kube_versions,
    render,
)
from tuner.backends._base import TrialLaunch
from tuner.backends.kubernetes import manifests
from tuner.backends.kubernetes.settings import KubeSettings
from tuner.spec import Resources


def trial_job(tmp_path: Path, gpu: int, **settings: Any) -> dict[str, Any]:
    data = tmp_path / "data"
    workdir = data / ".tunehub" / "sweeps" / "1" / "trials" / "1"
    workdir.mkdir(parents=True)
    kube = KubeSettings(namespace="lab", data_path=data, **settings)
    launch = TrialLaunch(sweep_id=1, trial_id=1, number=0, attempt=1, owner="alice",
                         command="true", workdir=workdir, env={},
                         resources=Resources(gpu=gpu, memory="8Gi"), timeout=None,
                         log_path=workdir / "trial.log")
    return manifests.job(kube, launch)


@pytest.mark.parametrize(("gpu", "shm"), [(0, False), (1, False), (2, True), (8, True)])
def test_dev_shm_only_for_multi_gpu_pods(tmp_path: Path, gpu: int, shm: bool) -> None:
    job = trial_job(tmp_path, gpu)
    pod = job["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert ("dshm" in volumes) is shm and ("/dev/shm" in mounts) is shm
    if shm:
        assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    for version in kube_versions():
        kubernetes_validate.validate(job, version, strict=True)


def test_ephemeral_storage_from_the_chart(tmp_path: Path) -> None:
    objects = render(example_values())
    tuner = find(objects, "Deployment", f"{RELEASE}-tuner")
    env = {e["name"]: e.get("value") for e in
           tuner["spec"]["template"]["spec"]["containers"][0]["env"]}
    settings = KubeSettings.from_env({**env, "TUNEHUB_DATA": str(tmp_path / "data"),
                                      "TUNEHUB_HOME": str(tmp_path / "data" / ".tunehub")})
    assert settings.ephemeral_storage == "20Gi" and settings.instance == RELEASE
    job = trial_job(tmp_path, 1, ephemeral_storage=settings.ephemeral_storage)
    res = job["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert res["requests"]["ephemeral-storage"] == res["limits"]["ephemeral-storage"] == "20Gi"
    # Kueue admits only what its ClusterQueue covers: the chart's covers ephemeral-storage.
    cq = find(objects, "ClusterQueue", cluster_prefix(NAMESPACE))["spec"]
    covered = {r for g in cq["resourceGroups"] for r in g["coveredResources"]}
    assert set(res["limits"]) <= covered | {"nvidia.com/gpu"}
    assert "ephemeral-storage" not in trial_job(tmp_path / "x", 1)["spec"]["template"][
        "spec"]["containers"][0]["resources"]["limits"]


def test_trial_container_keeps_the_images_entrypoint(tmp_path: Path) -> None:
    """The trial image's entrypoint is tini (signals reach Python through the shell); a
    container ``command`` would replace it, so the trial's shell line goes in ``args``."""
    container = trial_job(tmp_path, 0)["spec"]["template"]["spec"]["containers"][0]
    assert "command" not in container
    assert container["args"] == ["/bin/sh", "-c", "true"]
