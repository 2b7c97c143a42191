"""The Helm chart ``helm/tunehub`` through the real Helm engine (helm-python-sdk: Helm's Go SDK as
a shared library in the wheel, so no ``helm`` binary or download): it lints, renders with the
minimal and the full GPU values, every object validates against the Kubernetes OpenAPI schema
(strict) of the two newest minor versions kubernetes-validate ships and every Kueue object
against Kueue's own v1beta2 CRD schema, typos and missing required values fail by name, RBAC
stays namespaced, pods are locked down, priorities protect the platform, names never collide
between releases, NetworkPolicies let real work through, generated secrets survive an upgrade
(``lookup`` against the emulated API server), and the hub config read from the rendered values
gives the KubeSpawner settings they describe.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import httpx
import kubernetes_validate
import pytest
from kubernetes_validate.utils import SchemaNotFoundError

from kubesim.validation import _crd_validator
from tests.test_hub_kube_config import (
    CHART,
    NAMESPACE,
    RELEASE,
    assert_kubespawner_matches,
    cluster_prefix,
    example_values,
    find,
    kube_versions,
    minimal_values,
    parse_manifests,
    render,
    rendered_hub_config,
)

VALUE_SETS = {"minimal": "minimal", "gpu-example": "example", "every-option": "options"}
KUEUE_KINDS = {"ResourceFlavor", "ClusterQueue", "LocalQueue", "WorkloadPriorityClass"}
#: Custom resources (no schema in kubernetes-validate): Kueue's (checked against Kueue's own
#: CRD schema instead), prometheus-operator's and the Gateway API's.
CRD_KINDS = KUEUE_KINDS | {"ServiceMonitor", "HTTPRoute"}
#: The only cluster-scoped objects the chart may create.
CLUSTER_SCOPED = {"PriorityClass", "ResourceFlavor", "ClusterQueue", "WorkloadPriorityClass"}


PC = cluster_prefix()


def every_option() -> dict[str, Any]:
    """The GPU example with every optional part switched the other way: an HTTPRoute instead
    of the Ingress, the NFS permissions init, OIDC logins with the client secret from a Secret,
    operator-managed tokens, existing core/notebook classes, the LocalQueue-only Kueue mode."""
    from tests.test_hub_kube_config import OIDC

    values = example_values()
    values["data"]["fixPermissions"] = True
    values["ingress"] = {"enabled": False}
    values["httpRoute"] = {"enabled": True, "hostnames": ["lab.example.com"],
                           "parentRefs": [{"name": "public", "namespace": "gateway",
                                           "sectionName": "https"}]}
    values["hub"].update(config=OIDC, existingSecret="lab-tokens",
                         extraSecretEnv={"OAUTH_CLIENT_SECRET": {"name": "idp", "key": "s"}})
    values["priorityClasses"] = {"core": {"value": 100000, "name": "platform-critical"},
                                 "notebook": {"value": 1000, "name": "interactive"}}
    values["kueue"] = {"enabled": True, "existingClusterQueue": "gpu-pool",
                       "queueNotebooks": True}
    values["networkPolicy"]["servingFrom"] = [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}}]
    return values


def values_for(which: str) -> dict[str, Any]:
    return {"example": example_values, "minimal": minimal_values,
            "options": every_option}[VALUE_SETS[which]]()


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
    assert KUEUE_KINDS | {"ServiceMonitor"} <= kinds  # Kueue and the ServiceMonitor are on
    assert {"PodDisruptionBudget", "NetworkPolicy", "PriorityClass", "Ingress"} <= kinds
    default_kinds = {o["kind"] for o in render(minimal_values())}
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
        if obj["kind"] in KUEUE_KINDS:
            assert kueue_errors(obj) == [], obj
    # Only custom resources may go unchecked, never a misspelt core kind.
    assert without_schema <= CRD_KINDS


def kueue_errors(obj: dict[str, Any]) -> list[str]:
    """What Kueue's v1beta2 CRD schema (vendored from kubernetes-sigs/kueue) says of ``obj``,
    unknown fields included."""
    validator = _crd_validator(obj["apiVersion"], obj["kind"])
    assert validator is not None, f"{obj['apiVersion']} {obj['kind']}: not a current Kueue API"
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(obj)]


@pytest.mark.parametrize(("typo", "key"), [
    ({"hub": {"logLevle": "INFO"}}, "logLevle"),
    ({"gpuType": []}, "gpuType"),
    ({"notebooks": {"profiles": [{"slug": "x", "displayName": "X", "gpu": 1}]}}, "gpu"),
    ({"gpuTypes": [{"name": "a100", "product": "A", "maxPerNode": 8, "quotaa": 1}]}, "quotaa"),
    ({"kueue": {"enabled": True, "preemption": "Always"}}, "preemption"),
    ({"kueue": {"enabled": True, "fairSharingWeight": "a lot"}}, "fairSharingWeight"),
    ({"kueue": {"enabled": True, "reclaimWithinCohort": "Sometimes"}}, "reclaimWithinCohort"),
    ({"sweeps": {"unschedulableTimeout": "forever"}}, "unschedulableTimeout"),
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
    # One cluster-wide grant: get on the release's one ClusterQueue (the pool view's flavors),
    # bound to the tuner alone.
    (cluster_role,) = [o for o in objects if o["kind"] == "ClusterRole"]
    (queue,) = [o for o in objects if o["kind"] == "ClusterQueue"]
    assert cluster_role["rules"] == [{"apiGroups": ["kueue.x-k8s.io"],
                                      "resources": ["clusterqueues"],
                                      "resourceNames": [queue["metadata"]["name"]],
                                      "verbs": ["get"]}]
    (cluster_binding,) = [o for o in objects if o["kind"] == "ClusterRoleBinding"]
    assert cluster_binding["roleRef"]["name"] == cluster_role["metadata"]["name"]
    assert cluster_binding["subjects"] == [
        {"kind": "ServiceAccount", "name": f"{RELEASE}-tuner", "namespace": NAMESPACE}]
    cluster_scoped = {o["kind"] for o in objects if "namespace" not in o["metadata"]
                      and o["kind"] in CLUSTER_SCOPED | {"Namespace",
                                                         "CustomResourceDefinition"}}
    assert cluster_scoped == CLUSTER_SCOPED
    tuner = find(objects, "Role", f"{RELEASE}-tuner")
    granted = {(g, r) for rule in tuner["rules"] for g in rule["apiGroups"]
               for r in rule["resources"]}
    assert granted == {("batch", "jobs"), ("", "pods"), ("", "pods/log"), ("", "events"),
                       ("", "services"), ("", "secrets"), ("networking.k8s.io", "networkpolicies"),
                       # Kueue on: its Workloads (watched) and the queue's positions
                       ("kueue.x-k8s.io", "workloads"),
                       ("visibility.kueue.x-k8s.io", "localqueues/pendingworkloads")}
    # No Secret is readable nor changeable, not even the tuner's own (the verbs actually used
    # are checked against these Roles by the Kubernetes-mode tests, which run under them).
    secrets = [rule for rule in tuner["rules"] if "secrets" in rule["resources"]]
    assert [sorted(rule["verbs"]) for rule in secrets] == [["create"]]
    hub = find(objects, "Role", f"{RELEASE}-hub")
    assert {r for rule in hub["rules"] for r in rule["resources"]} == {"pods", "events"}
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
            for probe in (ctr["readinessProbe"], ctr["livenessProbe"]):
                if "httpGet" in probe:  # a real endpoint of this container's own port names
                    assert probe["httpGet"]["port"] in {p["name"] for p in ctr["ports"]}, name
            assert ":latest" not in ctr["image"], name
        for ctr in spec.get("initContainers", []):
            assert ctr["resources"]["requests"] and ctr["resources"]["limits"], name
        assert spec["enableServiceLinks"] is False, name
        assert spec["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch", name
        wants_api = name.endswith(("-hub", "-tuner"))
        assert spec.get("automountServiceAccountToken") is wants_api, name


def test_no_default_password_and_db_url_from_the_operators_secret() -> None:
    first, second = render(example_values()), render(example_values())
    for key in ("proxy-token", "tuner-token"):
        token = find(first, "Secret", f"{RELEASE}-tokens")["data"][key]
        assert len(token) >= 64
        assert token != find(second, "Secret", f"{RELEASE}-tokens")["data"][key]
    for name, spec in pod_specs(first).items():
        for ctr in spec["containers"]:
            for env in ctr.get("env", []):
                if env["name"] in ("TUNEHUB_DB_URL", "TUNEHUB_HUB_DB_URL"):
                    ref = env["valueFrom"]["secretKeyRef"]
                    assert ref["name"] == "tunehub-db", name
                assert "password" not in str(env.get("value", "")).lower(), name
    # The tuner's URL always comes from the operator's Secret (PostgreSQL, never SQLite on
    # the network volume): without one the install is refused (test_required_values...).
    tuner = pod_specs(render(minimal_values()))[f"{RELEASE}-tuner"]["containers"][0]
    ref = {e["name"]: e for e in tuner["env"]}["TUNEHUB_DB_URL"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "tunehub-db", "key": "url"}


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
    classes = json.loads(tuner_env["TUNEHUB_K8S_PRIORITY_CLASSES"]["value"])
    assert classes == {"high": f"{PC}-sweep-high-500", "normal": f"{PC}-sweep-normal-100",
                       "low": f"{PC}-sweep-low-10"}
    for name in classes.values():
        find(objects, "PriorityClass", name)
    labels = json.loads(tuner_env["TUNEHUB_K8S_POD_LABELS"]["value"])
    trial_policy = find(objects, "NetworkPolicy", f"{RELEASE}-trial")
    assert trial_policy["spec"]["podSelector"]["matchLabels"] == labels


def test_trials_reach_the_tuner_dns_and_the_mirror() -> None:
    objects = render(example_values())
    policy = find(objects, "NetworkPolicy", f"{RELEASE}-trial")["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    # No trial admits another: an attempt's own workers reach each other through the policy
    # the tuner creates with its Job (tests/security/test_kubernetes_isolation.py).
    assert policy["ingress"] == []
    egress = policy["egress"]
    tuner_rule, dns_rule, mirror_rule = egress
    assert tuner_rule["to"][0]["podSelector"]["matchLabels"][
        "app.kubernetes.io/component"] == "tuner"
    # DNS to any destination (cluster DNS or NodeLocal DNSCache), UDP and TCP.
    assert "to" not in dns_rule
    assert {(p["protocol"], p["port"]) for p in dns_rule["ports"]} == {("UDP", 53),
                                                                        ("TCP", 53)}
    assert mirror_rule == example_values()["networkPolicy"]["extraEgress"][0]
    notebook = find(objects, "NetworkPolicy", f"{RELEASE}-notebook")["spec"]
    reached = {peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
               for rule in notebook["egress"] for peer in rule.get("to", [])
               if "podSelector" in peer and "app.kubernetes.io/component" in
               peer["podSelector"].get("matchLabels", {})}
    assert reached == {"hub", "proxy", "tuner", "serving"}
    assert example_values()["networkPolicy"]["extraEgress"][0] in notebook["egress"]
    serving = find(objects, "NetworkPolicy", f"{RELEASE}-serving")["spec"]
    callers = {peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
               for rule in serving["ingress"] for peer in rule["from"]}
    assert callers == {"notebook", "tuner"}
    assert serving["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "serving"
    assert [r for r in serving["egress"] if "to" in r] == []  # DNS only


def test_kueue_and_serving_follow_the_gpu_types() -> None:
    objects = render(example_values())
    flavors = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ResourceFlavor"}
    assert flavors[f"{PC}-a100"]["spec"]["nodeLabels"] == {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    cq = find(objects, "ClusterQueue", PC)["spec"]
    assert cq["cohortName"] == "research-gpus"
    gpu_group = next(g for g in cq["resourceGroups"] if g["coveredResources"] == ["nvidia.com/gpu"])
    # Older GPUs first (generation order), quotas from the values.
    assert [(f["name"], f["resources"][0]["nominalQuota"]) for f in gpu_group["flavors"]] == [
        (f"{PC}-t4", 8), (f"{PC}-a100", 16)]
    # Serving's labels follow the registry, not the values: tests/test_helm_serving.py.


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


# --- priorities -----------------------------------------------------------------------------

def priority_of(objects: list[dict[str, Any]], class_name: str) -> dict[str, Any]:
    return find(objects, "PriorityClass", class_name)


def test_priorities_protect_the_platform(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Core pods > notebooks > sweeps; no sweep class preempts anything (the scheduler never
    evicts a notebook or a core pod for a sweep; Kueue orders sweeps among themselves)."""
    objects, hv, c = rendered_hub_config(example_values(), tmp_path, monkeypatch)
    specs = pod_specs(objects)
    core = {name: priority_of(objects, specs[name]["priorityClassName"])
            for name in (f"{RELEASE}-hub", f"{RELEASE}-proxy", f"{RELEASE}-tuner")}
    notebook = priority_of(objects, c.TunehubKubeSpawner.priority_class_name)
    tuner_env = {e["name"]: e.get("value") for e in specs[f"{RELEASE}-tuner"]["containers"][0]
                 ["env"]}
    sweeps = {level: priority_of(objects, name) for level, name in
              json.loads(tuner_env["TUNEHUB_K8S_PRIORITY_CLASSES"]).items()}
    assert min(pc["value"] for pc in core.values()) > notebook["value"]
    assert notebook["value"] > max(pc["value"] for pc in sweeps.values())
    assert sweeps["high"]["value"] >= sweeps["normal"]["value"] >= sweeps["low"]["value"]
    assert all(pc["preemptionPolicy"] == "Never" for pc in sweeps.values())
    assert notebook["preemptionPolicy"] == "PreemptLowerPriority"
    assert not any(o.get("globalDefault") for o in objects if o["kind"] == "PriorityClass")


def release_render(release: str, values: dict[str, Any]) -> list[dict[str, Any]]:
    with helm.Chart.load(CHART) as chart:
        return parse_manifests(chart.render(values, name=release, namespace=release,
                                            is_install=True))


def test_cluster_scoped_names_never_collide_between_releases() -> None:
    first, second = release_render("lab-a", example_values()), release_render(
        "lab-b", example_values())
    names = [{(o["kind"], o["metadata"]["name"]) for o in objs if o["kind"] in CLUSTER_SCOPED}
             for objs in (first, second)]
    assert names[0] and not names[0] & names[1]
    for kind, name in names[0]:
        assert name.startswith("lab-a-"), (kind, name)


def test_a_changed_priority_value_is_a_new_class_not_an_immutable_patch() -> None:
    """PriorityClass value and preemptionPolicy are immutable: an upgrade changing a value
    must create another object (by name), never patch the old one."""
    before = {o["metadata"]["name"]: o for o in render(example_values())
              if o["kind"] == "PriorityClass"}
    values = example_values()
    values["priorityClasses"] = {"notebook": {"value": 2000}}
    after = {o["metadata"]["name"]: o for o in render(values) if o["kind"] == "PriorityClass"}
    for name in before.keys() & after.keys():  # same name: identical immutable fields
        assert (before[name]["value"], before[name]["preemptionPolicy"]) == (
            after[name]["value"], after[name]["preemptionPolicy"]), name
    assert f"{PC}-notebook-2000" in after and f"{PC}-notebook-1000" not in after
    # Helm keeps the old class: Jobs made before the upgrade still name it for new pods.
    for pc in before.values():
        assert pc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_existing_priority_classes_are_used_instead(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    values = example_values()
    values["priorityClasses"] = {"core": {"value": 100000, "name": "platform-critical"},
                                 "notebook": {"value": 1000, "name": "interactive"}}
    objects, _, c = rendered_hub_config(values, tmp_path, monkeypatch)
    created = {o["metadata"]["name"] for o in objects if o["kind"] == "PriorityClass"}
    assert created == {f"{PC}-sweep-high-500", f"{PC}-sweep-normal-100",
                       f"{PC}-sweep-low-10"}
    assert pod_specs(objects)[f"{RELEASE}-hub"]["priorityClassName"] == "platform-critical"
    assert c.TunehubKubeSpawner.priority_class_name == "interactive"


def test_priorities_out_of_order_are_refused() -> None:
    values = example_values()
    values["priorityClasses"] = {"sweepHigh": {"value": 5000}}
    with pytest.raises(helm.HelmError, match=r"priorityClasses: values must order core "
                                             r"\(100000\) > notebook \(1000\) > sweepHigh "
                                             r"\(5000\)"):
        render(values)


# --- Kueue ----------------------------------------------------------------------------------

def test_kueue_objects_are_current_kueue_api_field_by_field() -> None:
    objects = render(example_values())
    kueue = [o for o in objects if o["kind"] in KUEUE_KINDS]
    assert {o["kind"] for o in kueue} == KUEUE_KINDS
    for obj in kueue:
        assert obj["apiVersion"] == "kueue.x-k8s.io/v1beta2"
        assert kueue_errors(obj) == []
    # The vendored schema is strict: v1beta1's `cohort` is not a v1beta2 field.
    cq = find(objects, "ClusterQueue", PC)
    old = {**cq, "spec": {**cq["spec"], "cohort": "research-gpus"}}
    assert any("cohort" in e for e in kueue_errors(old))
    lq = find(objects, "LocalQueue", "tunehub")
    assert lq["spec"]["clusterQueue"] == cq["metadata"]["name"]


def test_kueue_orders_notebooks_above_sweeps_and_shares_between_teams() -> None:
    """Workload priorities follow the PriorityClass values (notebooks above every sweep,
    sweeps by priority) and label what the tuner queues; preemption inside the team's
    ClusterQueue and fair sharing across its cohort are values, valid for Kueue's CRDs."""
    values = example_values()
    values["kueue"].update(preemption="LowerPriority", cohortName="research-gpus",
                           reclaimWithinCohort="LowerPriority",
                           borrowWithinCohort="LowerPriority", fairSharingWeight="2.5")
    objects = render(values)
    classes = {o["metadata"]["name"]: o["value"] for o in objects
               if o["kind"] == "WorkloadPriorityClass"}
    assert classes == {f"{PC}-notebook-1000": 1000, f"{PC}-sweep-high-500": 500,
                       f"{PC}-sweep-normal-100": 100, f"{PC}-sweep-low-10": 10}
    for obj in objects:
        if obj["kind"] in KUEUE_KINDS:
            assert kueue_errors(obj) == [], obj
    cq = find(objects, "ClusterQueue", PC)
    assert cq["spec"]["cohortName"] == "research-gpus"
    assert cq["spec"]["preemption"] == {"withinClusterQueue": "LowerPriority",
                                        "reclaimWithinCohort": "LowerPriority",
                                        "borrowWithinCohort": {"policy": "LowerPriority"}}
    assert cq["spec"]["fairSharing"] == {"weight": "2.5"}
    tuner_env = {e["name"]: e.get("value") for e in
                 pod_specs(objects)[f"{RELEASE}-tuner"]["containers"][0]["env"]}
    assert json.loads(tuner_env["TUNEHUB_K8S_WORKLOAD_PRIORITY_CLASSES"]) == {
        "high": f"{PC}-sweep-high-500", "normal": f"{PC}-sweep-normal-100",
        "low": f"{PC}-sweep-low-10"}
    assert tuner_env["TUNEHUB_K8S_CLUSTER_QUEUE"] == PC
    assert tuner_env["TUNEHUB_K8S_UNSCHEDULABLE_TIMEOUT"] == ""  # trials wait by default
    # Defaults: no fair-sharing weight, no borrowing by preemption.
    default_cq = find(render(example_values()), "ClusterQueue", PC)
    assert "fairSharing" not in default_cq["spec"]
    assert default_cq["spec"]["preemption"] == {"withinClusterQueue": "LowerPriority",
                                                "reclaimWithinCohort": "Any"}
    # Kueue refuses what it would refuse: a borrowing policy it does not know.
    bad = {**cq, "spec": {**cq["spec"], "preemption": {"withinClusterQueue": "Always"}}}
    assert kueue_errors(bad)


def test_existing_cluster_queue_mode_creates_only_a_local_queue(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    values = example_values()
    values["kueue"] = {"enabled": True, "existingClusterQueue": "gpu-pool",
                       "queueNotebooks": True}
    objects, _, c = rendered_hub_config(values, tmp_path, monkeypatch)
    kueue = [o for o in objects if o["kind"] in KUEUE_KINDS - {"WorkloadPriorityClass"}]
    assert [(o["kind"], o["metadata"]["name"]) for o in kueue] == [("LocalQueue", RELEASE)]
    assert kueue[0]["spec"] == {"clusterQueue": "gpu-pool"}
    tuner_env = {e["name"]: e.get("value") for e in
                 pod_specs(objects)[f"{RELEASE}-tuner"]["containers"][0]["env"]}
    assert tuner_env["TUNEHUB_K8S_QUEUE"] == RELEASE
    # Notebooks queued in the same LocalQueue: their GPUs count against the same pool, and
    # their workload priority is above every sweep's.
    assert c.TunehubKubeSpawner.extra_labels == {
        "kueue.x-k8s.io/queue-name": RELEASE,
        "kueue.x-k8s.io/priority-class": f"{PC}-notebook-1000"}
    assert tuner_env["TUNEHUB_K8S_CLUSTER_QUEUE"] == "gpu-pool"
    assert c.TunehubKubeSpawner.kueue_cluster_queue == "gpu-pool"  # named on the spawn page
    hub_role = find(objects, "Role", f"{RELEASE}-hub")
    assert {"apiGroups": ["visibility.kueue.x-k8s.io"], "verbs": ["get"],
            "resources": ["localqueues/pendingworkloads"]} in hub_role["rules"]


def test_emulated_kueue_serves_v1beta2_only_and_takes_the_charts_objects(kube: Any) -> None:
    """The emulator's Kueue is a current Kueue: the chart's objects are accepted as they are,
    v1beta1 is not served, and a field v1beta2 lacks is refused."""
    from kubesim.client import ApiFailure

    objects = render(example_values(), namespace=kube.namespace)
    for obj in objects:
        if obj["kind"] in KUEUE_KINDS:
            kube.create(obj)
    assert {o["metadata"]["name"] for o in kube.objects(
        "clusterqueues", group="kueue.x-k8s.io", version="v1beta2")} == {
            cluster_prefix(kube.namespace)}
    r = httpx.get(f"{kube.url}/apis/kueue.x-k8s.io/v1beta1/clusterqueues", timeout=10)
    assert r.status_code == 404
    with pytest.raises(ApiFailure) as refused:
        kube.create({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
                     "metadata": {"name": "old-style"},
                     "spec": {"cohort": "research-gpus", "resourceGroups": []}})
    assert refused.value.status == 422 and "cohort" in str(refused.value)


# --- labels, required values, secrets, entry points -----------------------------------------

def test_network_policies_select_the_pods_with_name_override(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    values = example_values()
    values["nameOverride"] = "gpulab"
    objects, _, c = rendered_hub_config(values, tmp_path, monkeypatch)
    ks = c.TunehubKubeSpawner
    notebook_labels = {**ks.common_labels, "app.kubernetes.io/component": ks.component_label}
    policy = find(objects, "NetworkPolicy", f"{RELEASE}-gpulab-notebook")["spec"]
    selector = policy["podSelector"]["matchLabels"]
    assert selector["app.kubernetes.io/name"] == "gpulab"
    assert selector.items() <= notebook_labels.items()
    tuner_env = {e["name"]: e.get("value") for e in
                 pod_specs(objects)[f"{RELEASE}-gpulab-tuner"]["containers"][0]["env"]}
    trial_labels = json.loads(tuner_env["TUNEHUB_K8S_POD_LABELS"])
    trial = find(objects, "NetworkPolicy", f"{RELEASE}-gpulab-trial")["spec"]
    assert trial["podSelector"]["matchLabels"].items() <= trial_labels.items()
    # Every peer selector of every policy matches some pod the chart, hub or tuner makes.
    pods = [{**spec_labels, } for spec_labels in (
        notebook_labels, trial_labels,
        *(d["spec"]["template"]["metadata"]["labels"] for d in objects
          if d["kind"] == "Deployment"))]
    for pol in (o for o in objects if o["kind"] == "NetworkPolicy"):
        peers = [peer["podSelector"]["matchLabels"] for rules in ("ingress", "egress")
                 for rule in pol["spec"].get(rules, []) for peer in
                 rule.get("from", rule.get("to", [])) if "podSelector" in peer
                 and "namespaceSelector" not in peer]
        for sel in [pol["spec"]["podSelector"]["matchLabels"], *peers]:
            if sel.get("app.kubernetes.io/component") == "serving":
                continue  # serving.yaml's Deployment (rendered only with serving on)
            assert any(sel.items() <= p.items() for p in pods), (pol["metadata"]["name"], sel)


@pytest.mark.parametrize(("values", "message"), [
    ({"data": {"storageClassName": "nfs"}}, "at '/db': missing property 'existingSecret'"),
    ({"db": {"existingSecret": "pg"}}, "missing property 'storageClassName'"),
    ({"db": {"existingSecret": "pg"}, "data": {"storageClassName": ""}},
     "at '/data/storageClassName': minLength"),
])
def test_required_values_are_refused_by_name(values: dict[str, Any], message: str) -> None:
    """No PostgreSQL Secret (the tuner would fall back to SQLite on the network volume) or no
    explicit ReadWriteMany class/claim (the claim would stay Pending): refused, by name."""
    with pytest.raises(helm.HelmValuesError, match=re.escape(message)):
        render(values)


#: What the chart's ``lookup`` calls read. Helm's Go client (helm-python-sdk) sends no token
#: over plain HTTP, so the emulator sees it as ``system:anonymous``.
HELM_LOOKUP = [{"apiGroups": [""], "resources": ["secrets", "persistentvolumeclaims"],
                "verbs": ["get"]}]


def test_generated_secrets_survive_an_upgrade(kube: Any) -> None:
    """Helm's ``lookup`` against the (emulated) API server: an upgrade renders the tokens and
    the admin password already in the cluster, never new ones."""
    values = example_values()
    with helm.Chart.load(CHART) as chart:
        install = parse_manifests(chart.render(values, name=RELEASE, namespace=kube.namespace,
                                               is_install=True))
    generated = {o["metadata"]["name"]: o for o in install if o["kind"] == "Secret"
                 and o["metadata"]["name"] != f"{RELEASE}-hub-values"}
    assert set(generated) == {f"{RELEASE}-tokens", f"{RELEASE}-hub-admin"}
    for secret in generated.values():
        kube.create(secret)
    kube.grant_anonymous(HELM_LOOKUP)
    with helm.Config(kubeconfig_path=str(kube.kubeconfig)) as config, \
            helm.Chart.load(CHART) as chart:
        upgrade = parse_manifests(config.render(chart, values, name=RELEASE,
                                                namespace=kube.namespace, is_upgrade=True))
    for name, secret in generated.items():
        assert find(upgrade, "Secret", name)["data"] == secret["data"], name


def test_tokens_from_an_existing_secret() -> None:
    values = example_values()
    values["hub"]["existingSecret"] = "lab-tokens"
    objects = render(values)
    assert not [o for o in objects if o["kind"] == "Secret"
                and o["metadata"]["name"] == f"{RELEASE}-tokens"]
    refs = {e["valueFrom"]["secretKeyRef"]["key"]: e["valueFrom"]["secretKeyRef"]["name"]
            for spec in pod_specs(objects).values() for ctr in spec["containers"]
            for e in ctr.get("env", []) if "token" in e.get("valueFrom", {}).get(
                "secretKeyRef", {}).get("key", "")}
    assert refs == {"proxy-token": "lab-tokens", "tuner-token": "lab-tokens"}


def test_ingress_or_httproute_with_tls() -> None:
    objects = render(example_values())
    ingress = find(objects, "Ingress", RELEASE)["spec"]
    assert ingress["tls"] == [{"hosts": ["lab.example.com"], "secretName": "lab-example-com-tls"}]
    backend = ingress["rules"][0]["http"]["paths"][0]["backend"]["service"]
    find(objects, "Service", backend["name"])
    values = example_values()
    values["ingress"] = {"enabled": False}
    values["httpRoute"] = {"enabled": True, "hostnames": ["lab.example.com"], "parentRefs": [
        {"name": "public", "namespace": "gateway", "sectionName": "https"}]}
    objects = render(values)
    assert not [o for o in objects if o["kind"] == "Ingress"]
    route = find(objects, "HTTPRoute", RELEASE)
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert route["spec"]["parentRefs"][0]["sectionName"] == "https"
    assert route["spec"]["rules"][0]["backendRefs"][0]["name"] == f"{RELEASE}-proxy-public"


def proxy_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    spec = find(objects, "Deployment", f"{RELEASE}-proxy")["spec"]["template"]["spec"]
    return dict(spec["containers"][0])


def test_the_proxy_is_bounded_by_its_values() -> None:
    """#31: configurable-http-proxy gets its timeouts as flags and its header cap through
    Node.js; the body and per-client connection caps it has no option for are the Ingress's
    (ingress-nginx annotations), where the operator's own annotations still win. (Checked by
    hand against configurable-http-proxy 4.6.3 on Node 20: these flags start it, and a
    20 KiB header is a 431 under the default cap.)"""
    # The GPU example sets its own body size (512m, for uploads): it is kept.
    example = find(render(example_values()), "Ingress", RELEASE)["metadata"]["annotations"]
    assert example["nginx.ingress.kubernetes.io/proxy-body-size"] == "512m"
    values = example_values()
    values["ingress"]["annotations"] = {}
    objects = render(values)
    proxy = proxy_container(objects)
    assert "--timeout=300000" in proxy["command"]
    assert not [arg for arg in proxy["command"] if arg.startswith("--proxy-timeout")]
    env = {e["name"]: e.get("value") for e in proxy["env"]}
    assert env["NODE_OPTIONS"] == "--max-http-header-size=16384"
    annotations = find(objects, "Ingress", RELEASE)["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/proxy-body-size"] == "104857600"
    assert annotations["nginx.ingress.kubernetes.io/limit-connections"] == "256"

    values = example_values()
    values["proxy"]["limits"] = {"timeoutSeconds": 0, "proxyTimeoutSeconds": 30,
                                 "maxHeaderBytes": 8192, "maxBodyBytes": 0,
                                 "maxConnectionsPerClient": 0}
    values["ingress"]["annotations"] = {"nginx.ingress.kubernetes.io/limit-connections": "9"}
    objects = render(values)
    proxy = proxy_container(objects)
    assert "--proxy-timeout=30000" in proxy["command"]
    assert not [arg for arg in proxy["command"] if arg.startswith("--timeout")]
    assert {e["name"]: e.get("value") for e in proxy["env"]}["NODE_OPTIONS"] == \
        "--max-http-header-size=8192"
    annotations = find(objects, "Ingress", RELEASE)["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/proxy-body-size"] == "0"  # nginx: no cap
    assert annotations["nginx.ingress.kubernetes.io/limit-connections"] == "9"  # the operator's


@pytest.mark.parametrize(("limits", "message"), [
    ({"timeoutSeconds": -1}, "at '/proxy/limits/timeoutSeconds': minimum"),
    ({"maxBodyBytes": "100m"}, "at '/proxy/limits/maxBodyBytes'"),
    ({"maxHeaderBytes": 10}, "at '/proxy/limits/maxHeaderBytes': minimum"),
    ({"maxBody": 1}, "'maxBody' not allowed"),
])
def test_wrong_proxy_limits_are_refused_by_name(limits: dict[str, Any], message: str) -> None:
    values = minimal_values()
    values.setdefault("proxy", {})["limits"] = limits
    with pytest.raises(helm.HelmValuesError, match=re.escape(message)):
        render(values)


def test_nfs_permissions_init_is_minimal_and_off_by_default() -> None:
    assert "initContainers" not in pod_specs(render(example_values()))[f"{RELEASE}-hub"]
    values = example_values()
    values["data"]["fixPermissions"] = True
    init = pod_specs(render(values))[f"{RELEASE}-hub"]["initContainers"][0]
    assert init["securityContext"]["capabilities"] == {
        "drop": ["ALL"], "add": ["CHOWN", "FOWNER", "DAC_OVERRIDE"]}
    assert init["securityContext"]["allowPrivilegeEscalation"] is False
    assert "chown 1000:100" in init["args"][0]


def test_notes_say_how_to_log_in() -> None:
    def notes(values: dict[str, Any]) -> str:
        with helm.Chart.load(CHART) as chart:
            out = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
        return next(text for path, text in out.items() if path.endswith("NOTES.txt"))

    text = notes(minimal_values())
    assert (f"kubectl -n {NAMESPACE} get secret {RELEASE}-hub-admin -o "
            "jsonpath='{.data.password}' | base64 -d") in text
    assert 'Log in as "admin"' in text
    values = minimal_values()
    values["hub"] = {"config": {"JupyterHub": {"authenticator_class": "github"}}}
    text = notes(values)
    assert "hub-admin" not in text and "Logins go through github" in text


def test_an_upgrade_changing_a_claims_storage_class_is_refused_up_front(kube: Any) -> None:
    """A PVC's storage class is immutable: instead of an API error halfway through the upgrade,
    the render (with ``lookup`` on the emulated cluster) refuses and says what to do."""
    values, release = example_values(), "lab2"
    claim = find(render(values, namespace=kube.namespace, release=release),
                 "PersistentVolumeClaim", f"{release}-tunehub-data")
    kube.create(claim)
    kube.grant_anonymous(HELM_LOOKUP)
    values["data"]["storageClassName"] = "cephfs"
    with helm.Config(kubeconfig_path=str(kube.kubeconfig)) as config, \
            helm.Chart.load(CHART) as chart:
        with pytest.raises(helm.HelmError, match=r"data.storageClassName: the claim "
                                                 r"lab2-tunehub-data exists with storage class "
                                                 r"\"nfs-client\", which cannot change"):
            config.render(chart, values, name=release, namespace=kube.namespace,
                          is_upgrade=True)
        values["data"]["storageClassName"] = "nfs-client"  # unchanged: renders
        config.render(chart, values, name=release, namespace=kube.namespace, is_upgrade=True)


def test_on_a_cluster_notebooks_preempt_sweeps_and_sweeps_never_preempt(kube: Any) -> None:
    """The chart's PriorityClasses on the emulated cluster (scheduler with priorities and
    preemption): a higher sweep waits instead of evicting a running trial, a notebook takes the
    GPUs of a running trial, and no trial evicts the notebook."""
    import sys

    from tests.polling import wait_for

    objects = render(example_values(), namespace=kube.namespace)
    for obj in objects:
        if obj["kind"] == "PriorityClass":
            kube.create(obj)
    classes = {o["metadata"]["labels"]["tunehub.io/priority-role"]: o["metadata"]["name"]
               for o in objects if o["kind"] == "PriorityClass"}

    def pod(name: str, role: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
            "priorityClassName": classes[role], "restartPolicy": "Never",
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                             "effect": "NoSchedule"}],
            "containers": [{"name": "main", "image": "python:3.11",
                            "command": [sys.executable, "-c", "import time; time.sleep(300)"],
                            "resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "1",
                                                     "memory": "1Gi"}}}]}}

    def phase(name: str) -> str | None:
        found = kube.get("pods", name)
        return found["status"].get("phase") if found else None

    def unschedulable(name: str) -> bool:
        conditions = ((kube.get("pods", name) or {}).get("status") or {}).get("conditions", [])
        return any(c.get("reason") == "Unschedulable" for c in conditions)

    kube.create(pod("low-trial", "sweep-low"))
    wait_for(lambda: phase("low-trial") == "Running", 30, "the low sweep's trial to run")
    # A high sweep's trial does not evict the low one through the scheduler (Never): ordering
    # sweeps is Kueue's job, by suspending whole Jobs.
    kube.create(pod("high-trial", "sweep-high"))
    wait_for(lambda: unschedulable("high-trial"), 30, "the high sweep's trial to wait")
    assert phase("low-trial") == "Running"
    # A person's notebook does take the GPUs.
    kube.create(pod("notebook", "notebook"))
    wait_for(lambda: phase("notebook") == "Running" and phase("low-trial") is None, 30,
             "the notebook to preempt the trial")
    # (The emulator's scheduler does not reserve a nominated node, so the waiting high trial
    # may bind to the freed GPUs for a moment and be preempted in turn; a real scheduler keeps
    # it Pending. Either way it does not run beside the notebook.)
    wait_for(lambda: phase("high-trial") in ("Pending", None), 30, "the high trial to yield")
    assert phase("notebook") == "Running"


def test_several_tuner_replicas_reach_each_other_and_roll() -> None:
    """``tuner.replicas``: one Deployment of that many pods, each telling the others its own
    address (its pod IP) for the reports they send on, the tuners' NetworkPolicy admitting
    the other replicas; one replica (the default) is replaced whole and admits no tuner."""
    values = example_values()
    values["tuner"]["replicas"] = 3
    objects = render(values)
    deployment = find(objects, "Deployment", f"{RELEASE}-tuner")
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    names = list(env)
    assert names.index("POD_IP") < names.index("TUNEHUB_REPLICA_URL")  # $(POD_IP) expands
    assert env["TUNEHUB_REPLICA_URL"]["value"].startswith("http://$(POD_IP):")

    def tuner_peers(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        policy = find(objs, "NetworkPolicy", f"{RELEASE}-tuner")
        return [peer for rule in policy["spec"]["ingress"] for peer in rule["from"]
                if peer.get("podSelector", {}).get("matchLabels", {}).get(
                    "app.kubernetes.io/component") == "tuner"]

    assert tuner_peers(objects)
    single = render(example_values())
    assert find(single, "Deployment", f"{RELEASE}-tuner")["spec"]["strategy"]["type"] == (
        "Recreate")
    assert tuner_peers(single) == []
