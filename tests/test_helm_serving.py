"""The chart's TensorFlow Serving: it reads the model config the tuner's registry writes (same
file, same paths), with the flags label moves need, a GPU when asked, readiness on the model's
status, a PodDisruptionBudget, and non-root pods with requests and limits."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest

from tests.serving_helpers import served
from tests.test_hub_kube_config import RELEASE, example_values, find, minimal_values, render

NAME = f"{RELEASE}-serving"


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def serving_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return find(objects, "Deployment", NAME)["spec"]["template"]


def test_serving_reads_the_config_the_registry_writes() -> None:
    objects = render(example_values())
    pod = serving_pod(objects)["spec"]
    serving = pod["containers"][0]
    flags = dict(a.removeprefix("--").split("=", 1) for a in serving["args"])
    tuner = find(objects, "Deployment", f"{RELEASE}-tuner")["spec"]["template"]["spec"]
    registry = env_of(tuner["containers"][0])["TUNEHUB_REGISTRY"]
    # The registry writes <TUNEHUB_REGISTRY>/models.config with base paths under the same
    # root (TUNEHUB_SERVING_ROOT unset): serving mounts the models at that very path.
    assert "TUNEHUB_SERVING_ROOT" not in env_of(tuner["containers"][0])
    assert flags["model_config_file"] == f"{registry}/models.config"
    mounts = {m["mountPath"]: m for m in serving["volumeMounts"]}
    assert mounts[registry]["readOnly"] is True
    assert flags["allow_version_labels_for_unavailable_models"] == "true"
    assert int(flags["model_config_file_poll_wait_seconds"]) >= 1
    assert not [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == NAME]


def test_serving_gpu_probes_budget_and_security() -> None:
    objects = render(example_values())
    template = serving_pod(objects)
    pod = template["spec"]
    serving = pod["containers"][0]
    assert serving["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert serving["resources"]["requests"] and serving["resources"]["limits"]["memory"]
    t4 = next(g for g in example_values()["gpuTypes"] if g["name"] == "t4")
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == t4["product"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
        pod["tolerations"]
    assert serving["readinessProbe"]["httpGet"] == {"path": "/v1/models/digits", "port": "rest"}
    assert serving["startupProbe"]["failureThreshold"] >= 1
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    tuner = find(objects, "Deployment", f"{RELEASE}-tuner")["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == tuner["priorityClassName"]  # core: never preempted
    for c in pod["containers"] + pod["initContainers"]:
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["resources"]["requests"] and c["resources"]["limits"], c["name"]
    pdb = find(objects, "PodDisruptionBudget", NAME)["spec"]
    assert pdb["maxUnavailable"] == 1
    assert pdb["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()


def test_serving_defaults_without_gpu_or_readiness_model() -> None:
    objects = render({**minimal_values(), "serving": {"enabled": True}})
    pod = serving_pod(objects)["spec"]
    serving = pod["containers"][0]
    assert "nvidia.com/gpu" not in serving["resources"].get("limits", {})
    assert "tolerations" not in pod and "nodeSelector" not in pod
    assert "tcpSocket" in serving["readinessProbe"]
    assert not [o for o in render(minimal_values()) if o["metadata"]["name"] == NAME]


def test_unknown_serving_gpu_type_fails_with_its_name() -> None:
    values = copy.deepcopy(example_values())
    values["serving"]["gpuType"] = "h100"
    with pytest.raises(helm.HelmError, match="serving.gpuType"):
        render(values)


def test_init_container_creates_an_empty_config_only_when_missing(tmp_path: Path) -> None:
    """Run the init container's own shell line (with the registry path pointed at a temporary
    directory): TensorFlow Serving gets a valid empty config, and an existing one is kept."""
    pod = serving_pod(render(example_values()))["spec"]
    init = pod["initContainers"][0]
    registry = init["volumeMounts"][0]["mountPath"]
    script = init["command"][-1].replace(registry, str(tmp_path))
    subprocess.run(init["command"][:-1] + [script], check=True)
    assert served(tmp_path / "models.config") == {}
    written = 'model_config_list {\n  config {\n    name: "m"\n    base_path: "/x/m"\n' \
              '    model_platform: "tensorflow"\n  }\n}\n'
    (tmp_path / "models.config").write_text(written)
    subprocess.run(init["command"][:-1] + [script], check=True)
    assert (tmp_path / "models.config").read_text() == written
