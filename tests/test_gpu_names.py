"""GPU resource, product label and taint key: one source of truth for the chart, the hub and the
tuner (tunehub_base/gpu_names.py explains the design). The chart's defaults are the Python defaults,
and a release with other names (another vendor's device plugin) uses them everywhere: Kueue,
serving, notebooks (the hub reads them from its values) and trial Jobs (the tuner reads them
from the environment the chart sets)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from helm_python.errors import HelmValuesError

from hub import kube
from tests.test_hub_kube_config import (
    CHART,
    NAMESPACE,
    RELEASE,
    cluster_prefix,
    example_values,
    find,
    hub_values,
    render,
)
from tests.test_kubernetes_backend import launch
from tunehub_base.gpu_names import ENV_VARS, VALUES_KEYS, GpuNames
from tuner.backends.kubernetes import KubeSettings
from tuner.backends.kubernetes import manifests as m
from tuner.spec import Resources

CUSTOM = {"resource": "amd.com/gpu", "productLabel": "amd.com/gpu.product-name",
          "taintKey": "example.com/accelerator"}
EXPECTED = GpuNames(resource="amd.com/gpu", product_label="amd.com/gpu.product-name",
                    taint_key="example.com/accelerator")


def test_chart_defaults_are_the_python_defaults() -> None:
    """Fails when values.yaml's gpuNames and tunehub_base.gpu_names drift apart."""
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())["gpuNames"]
    assert set(defaults) == set(VALUES_KEYS.values())
    assert GpuNames.from_values({"gpuNames": defaults}) == GpuNames()
    assert {VALUES_KEYS[k]: v for k, v in vars(GpuNames()).items()} == defaults
    # Values from before the key (a hub reading an older values file) keep the defaults.
    assert GpuNames.from_values({}) == GpuNames.from_env({}) == GpuNames()


def test_a_release_with_other_gpu_names_uses_them_everywhere(tmp_path: Path) -> None:
    values = example_values()
    values["gpuNames"] = CUSTOM
    objects = render(values)
    # Nothing of the chart names NVIDIA's GPUs any more.
    assert "nvidia.com/gpu" not in json.dumps(objects)

    flavor = find(objects, "ResourceFlavor", f"{cluster_prefix(NAMESPACE)}-a100")["spec"]
    assert flavor["nodeLabels"] == {EXPECTED.product_label: "NVIDIA-A100-SXM4-80GB"}
    assert flavor["tolerations"] == [EXPECTED.toleration()]
    cq = find(objects, "ClusterQueue", cluster_prefix(NAMESPACE))["spec"]
    gpu_group = next(g for g in cq["resourceGroups"] if g["coveredResources"] == [
        EXPECTED.resource])
    assert {r["name"] for f in gpu_group["flavors"] for r in f["resources"]} == {
        EXPECTED.resource}

    serving = find(objects, "Deployment", f"{RELEASE}-serving")["spec"]["template"]["spec"]
    assert EXPECTED.resource in serving["containers"][0]["resources"]["limits"]
    assert EXPECTED.product_label in serving["nodeSelector"]
    assert EXPECTED.toleration() in serving["tolerations"]

    # The hub: notebook profiles from the values the chart mounts into it.
    profiles = {p["slug"]: p["kubespawner_override"]
                for p in kube.profile_list(hub_values(objects))}
    gpu_profile = next(o for o in profiles.values() if "extra_resource_limits" in o)
    assert set(gpu_profile["extra_resource_limits"]) == {EXPECTED.resource}
    assert gpu_profile["tolerations"] == [EXPECTED.toleration()]
    assert set(gpu_profile.get("node_selector") or {EXPECTED.product_label: ""}) == {
        EXPECTED.product_label}

    # The tuner: its environment, as the chart sets it, gives trial Jobs the same names.
    tuner = find(objects, "Deployment", f"{RELEASE}-tuner")["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in tuner["containers"][0]["env"] if "value" in e}
    assert {k: env[v] for k, v in ENV_VARS.items()} == vars(EXPECTED)
    env["TUNEHUB_DATA"] = str(tmp_path)
    settings = KubeSettings.from_env(env)
    assert settings.gpu_names == EXPECTED
    pod = m.job(settings, launch(tmp_path, resources=Resources(gpu=2, gpu_type="a100"))
                )["spec"]["template"]["spec"]
    assert pod["tolerations"] == [EXPECTED.toleration()]
    assert pod["nodeSelector"] == {EXPECTED.product_label: "NVIDIA-A100-SXM4-80GB"}
    assert pod["containers"][0]["resources"]["limits"][EXPECTED.resource] == "2"


@pytest.mark.parametrize("key", sorted(CUSTOM))
def test_a_gpu_name_that_is_not_a_label_key_is_refused(key: str) -> None:
    values = example_values()
    values["gpuNames"] = {**CUSTOM, key: "not a name"}
    with pytest.raises(HelmValuesError, match=f"at '/gpuNames/{key}': 'not a name' does not "
                       "match pattern"):
        render(values)

