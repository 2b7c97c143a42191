"""The Helm chart ``helm/tunehub`` through the real Helm engine (helm-python-sdk: Helm's Go SDK as
a shared library in the wheel, so no ``helm`` binary or download): it lints, renders with the
default and the full GPU values, every object validates against the Kubernetes OpenAPI schema
(strict) of the two newest minor versions kubernetes-validate ships, typos fail by name, RBAC
stays namespaced, pods are locked down, and the hub config read from the rendered values gives
the KubeSpawner settings they describe.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
from kubernetes_validate.utils import SchemaNotFoundError

from tests.test_hub_kube_config import (
    CHART,
    NAMESPACE,
    RELEASE,
    assert_kubespawner_matches,
    example_values,
    find,
    kube_versions,
    render,
    rendered_hub_config,
)

VALUE_SETS = {"defaults": None, "gpu-example": "example"}
#: Custom resources (no schema in kubernetes-validate): Kueue's and prometheus-operator's.
CRD_KINDS = {"ResourceFlavor", "ClusterQueue", "LocalQueue", "ServiceMonitor"}
#: The only cluster-scoped objects the chart may create.
CLUSTER_SCOPED = {"PriorityClass", "ResourceFlavor", "ClusterQueue"}


def values_for(which: str) -> dict[str, Any] | None:
    return example_values() if VALUE_SETS[which] == "example" else None


@pytest.fixture(params=list(VALUE_SETS))
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return render(values_for(request.param))


def pod_specs(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o["spec"]["template"]["spec"]
            for o in objects if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job")}


def test_kube_versions_are_the_two_newest() -> None:
    versions = kube_versions()
    assert len(versions) == 2 and versions[0] < versions[1]


@pytest.mark.parametrize("which", list(VALUE_SETS))
def test_lint_passes_strict(which: str) -> None:
    report = helm.lint(CHART, values_for(which), strict=True, namespace=NAMESPACE)
    assert report["errors"] == [], report
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_gpu_example_renders_every_optional_part() -> None:
    kinds = {o["kind"] for o in render(example_values())}
    assert CRD_KINDS <= kinds  # Kueue and the ServiceMonitor are on in the example
    assert {"ConfigMap", "NetworkPolicy", "PriorityClass"} <= kinds
    default_kinds = {o["kind"] for o in render(None)}
    assert not CRD_KINDS & default_kinds  # nothing needing extra CRDs by default


def test_every_object_validates_strictly(rendered: list[dict[str, Any]]) -> None:
    without_schema = set()
    for obj in rendered:
        for version in kube_versions():
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except SchemaNotFoundError:
                without_schema.add(obj["kind"])
            except kubernetes_validate.ValidationError as exc:
                path = ".".join(str(p) for p in exc.path)
                pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} invalid for {version}: "
                            f"{path}: {exc.message}")
    # Only custom resources may go unchecked, never a misspelt core kind.
    assert without_schema <= CRD_KINDS


@pytest.mark.parametrize(("typo", "key"), [
    ({"hub": {"logLevle": "INFO"}}, "logLevle"),
    ({"gpuType": []}, "gpuType"),
    ({"notebooks": {"profiles": [{"slug": "x", "displayName": "X", "gpu": 1}]}}, "gpu"),
    ({"gpuTypes": [{"name": "a100", "product": "A", "maxPerNode": 8, "quotaa": 1}]}, "quotaa"),
    ({"kueue": {"enabled": True, "preemption": "Always"}}, "preemption"),
    ({"data": {"size": "lots"}}, "size"),
])
def test_misspelled_value_fails_with_its_name(typo: dict[str, Any], key: str) -> None:
    # Helm names the key: "additional properties 'logLevle' not allowed" for an unknown key,
    # "at '/kueue/preemption': ..." for a bad value.
    with pytest.raises(helm.HelmValuesError, match=rf"'{key}' not allowed|/{key}': "):
        render(typo)


def test_schema_forbids_unknown_keys_everywhere() -> None:
    """Every object in the schema either lists its keys and forbids others, or types its
    free-form values (labels, annotations, env) explicitly."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    loose = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                if node.get("additionalProperties") is not False:
                    loose.append(where)
            for k, v in node.items():
                walk(v, f"{where}/{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{where}/{i}")

    walk(schema, "")
    assert loose == []


def test_rbac_is_namespaced_and_minimal() -> None:
    objects = render(example_values())
    assert not [o for o in objects if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    cluster_scoped = {o["kind"] for o in objects if "namespace" not in o["metadata"]
                      and o["kind"] in CLUSTER_SCOPED | {"Namespace", "ClusterRole",
                                                         "CustomResourceDefinition"}}
    assert cluster_scoped == CLUSTER_SCOPED
    tuner = find(objects, "Role", f"{RELEASE}-tuner")
    granted = {(g, r) for rule in tuner["rules"] for g in rule["apiGroups"]
               for r in rule["resources"]}
    assert granted == {("batch", "jobs"), ("", "pods"), ("", "pods/log"), ("", "services"),
                       ("", "secrets")}
    hub = find(objects, "Role", f"{RELEASE}-hub")
    assert {r for rule in hub["rules"] for r in rule["resources"]} == {
        "pods", "persistentvolumeclaims", "events", "services", "secrets"}
    for binding in (o for o in objects if o["kind"] == "RoleBinding"):
        assert binding["roleRef"]["kind"] == "Role"


def test_pods_are_locked_down(rendered: list[dict[str, Any]]) -> None:
    for name, spec in pod_specs(rendered).items():
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["runAsUser"] > 0, name
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for ctr in spec["containers"]:
            sc = ctr["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["capabilities"] == {"drop": ["ALL"]}, name
            assert sc["readOnlyRootFilesystem"] is True, name
            assert ctr["resources"]["requests"] and ctr["resources"]["limits"], name
            assert "readinessProbe" in ctr and "livenessProbe" in ctr, name
            assert ":latest" not in ctr["image"], name
        assert spec["enableServiceLinks"] is False, name
        assert spec["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch", name
        wants_api = name.endswith(("-hub", "-tuner"))
        assert spec.get("automountServiceAccountToken") is wants_api, name


def test_no_default_password_and_db_url_from_the_operators_secret() -> None:
    first, second = render(example_values()), render(example_values())
    token = find(first, "Secret", f"{RELEASE}-proxy-token")["data"]["token"]
    assert len(token) >= 64
    assert token != find(second, "Secret", f"{RELEASE}-proxy-token")["data"]["token"]
    for name, spec in pod_specs(first).items():
        for ctr in spec["containers"]:
            for env in ctr.get("env", []):
                if env["name"] in ("TUNEHUB_DB_URL", "TUNEHUB_HUB_DB_URL"):
                    ref = env["valueFrom"]["secretKeyRef"]
                    assert ref["name"] == "tunehub-db", name
                assert "password" not in str(env.get("value", "")).lower(), name
    # Without a DB Secret the tuner gets no URL at all (SQLite; NOTES warns), never a default.
    tuner = pod_specs(render(None))[f"{RELEASE}-tuner"]["containers"][0]
    assert "TUNEHUB_DB_URL" not in {e["name"] for e in tuner["env"]}


def test_product_environment() -> None:
    objects = render(example_values())
    specs = pod_specs(objects)
    hub_env = {e["name"]: e for e in specs[f"{RELEASE}-hub"]["containers"][0]["env"]}
    tuner_env = {e["name"]: e for e in specs[f"{RELEASE}-tuner"]["containers"][0]["env"]}
    for env in (hub_env, tuner_env):
        assert env["TUNEHUB_MODE"]["value"] == "kubernetes"
        assert env["TUNEHUB_DATA"]["value"] == "/srv/tunehub/data"
        assert env["TUNEHUB_HOME"]["value"] == "/srv/tunehub/data/.tunehub"
        assert "TUNEHUB_DB_URL" in env
    assert hub_env["TUNEHUB_HUB_VALUES"]["value"] == "/usr/local/etc/tunehub/values.yaml"
    assert json.loads(tuner_env["TUNEHUB_K8S_GPU_TYPES"]["value"])[1] == {
        "name": "a100", "product": "NVIDIA-A100-SXM4-80GB", "generation": 2, "maxPerNode": 8}
    assert tuner_env["TUNEHUB_K8S_QUEUE"]["value"] == "tunehub"
    assert tuner_env["TUNEHUB_K8S_DATA_CLAIM"]["value"] == f"{RELEASE}-data"
    assert tuner_env["TUNEHUB_K8S_IMAGE"]["value"] == "registry.example.com/tunehub/trial:0.1.0"
    assert json.loads(tuner_env["TUNEHUB_K8S_PRIORITY_CLASSES"]["value"]) == {
        "high": "tunehub-sweep-high", "normal": "tunehub-sweep-normal",
        "low": "tunehub-sweep-low"}
    labels = json.loads(tuner_env["TUNEHUB_K8S_POD_LABELS"]["value"])
    trial_policy = find(objects, "NetworkPolicy", f"{RELEASE}-trial")
    assert trial_policy["spec"]["podSelector"]["matchLabels"] == labels


def test_trials_reach_only_the_tuner_and_dns() -> None:
    objects = render(example_values())
    policy = find(objects, "NetworkPolicy", f"{RELEASE}-trial")["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"] and policy["ingress"] == []
    egress = policy["egress"]
    assert len(egress) == 2
    tuner_rule, dns_rule = egress
    assert tuner_rule["to"][0]["podSelector"]["matchLabels"][
        "app.kubernetes.io/component"] == "tuner"
    assert {p["port"] for p in dns_rule["ports"]} == {53}
    notebook = find(objects, "NetworkPolicy", f"{RELEASE}-notebook")["spec"]
    reached = {peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
               for rule in notebook["egress"] for peer in rule.get("to", [])
               if "podSelector" in peer and "app.kubernetes.io/component" in
               peer["podSelector"].get("matchLabels", {})}
    assert reached == {"hub", "proxy", "tuner", "serving"}


def test_kueue_and_serving_follow_the_gpu_types() -> None:
    objects = render(example_values())
    flavors = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ResourceFlavor"}
    assert flavors[f"{RELEASE}-a100"]["spec"]["nodeLabels"] == {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    cq = find(objects, "ClusterQueue", "tunehub")["spec"]
    gpu_group = next(g for g in cq["resourceGroups"] if g["coveredResources"] == ["nvidia.com/gpu"])
    # Older GPUs first (generation order), quotas from the values.
    assert [(f["name"], f["resources"][0]["nominalQuota"]) for f in gpu_group["flavors"]] == [
        (f"{RELEASE}-t4", 8), (f"{RELEASE}-a100", 16)]
    config = find(objects, "ConfigMap", f"{RELEASE}-serving")["data"]["models.config"]
    assert 'version_labels { key: "stable" value: 3 }' in config
    assert 'version_labels { key: "canary" value: 4 }' in config
    assert 'base_path: "/srv/tunehub/data/models/digits"' in config


def test_existing_claim_is_used_everywhere(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    values = example_values()
    values["data"]["existingClaim"] = "lab-nfs"
    objects, hv, c = rendered_hub_config(values, tmp_path, monkeypatch)
    assert_kubespawner_matches(c, hv, objects)
    assert f"{RELEASE}-data" not in {o["metadata"]["name"] for o in objects
                                     if o["kind"] == "PersistentVolumeClaim"}
    for name, spec in pod_specs(objects).items():
        claims = {v["persistentVolumeClaim"]["claimName"] for v in spec.get("volumes", [])
                  if "persistentVolumeClaim" in v}
        assert claims <= {"lab-nfs", f"{RELEASE}-hub-state"}, name


def test_hub_config_from_rendered_gpu_values(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    objects, hv, c = rendered_hub_config(example_values(), tmp_path, monkeypatch)
    assert_kubespawner_matches(c, hv, objects)


def test_readme_values_reference_is_up_to_date() -> None:
    result = subprocess.run([sys.executable, str(CHART / "gen_values_doc.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
