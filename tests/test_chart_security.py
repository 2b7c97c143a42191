"""The chart's own pods (hub, proxy, tuner, TensorFlow Serving) pass the Pod Security level the
chart documents, as the API emulator enforces it; the documentation names that level."""

from __future__ import annotations

import copy

import httpx

from kubesim import KubeCluster
from kubesim.rbac import ADMIN_TOKEN
from tests.chart_security import POD_SECURITY, install_chart_security
from tests.test_hub_kube_config import CHART, example_values, render


def dry_run_pod(kube: KubeCluster, name: str, template: dict) -> httpx.Response:
    """Create (dry run: admission, nothing stored or run) the pod a ReplicaSet would create."""
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "labels": (template.get("metadata") or {}).get("labels")},
           "spec": copy.deepcopy(template["spec"])}
    return httpx.post(f"{kube.url}/api/v1/namespaces/{kube.namespace}/pods", json=pod,
                      params={"dryRun": "All"}, timeout=30,
                      headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})


def test_every_pod_of_the_chart_passes_restricted(kube: KubeCluster) -> None:
    objects = render(example_values(), namespace=kube.namespace)
    for obj in objects:
        if obj["kind"] == "PriorityClass":
            kube.create(obj)
    install_chart_security(kube)
    deployments = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Deployment"}
    assert set(deployments) == {"tunehub-hub", "tunehub-proxy", "tunehub-tuner",
                                "tunehub-serving"}
    for name, deployment in deployments.items():
        r = dry_run_pod(kube, f"{name}-x", deployment["spec"]["template"])
        assert r.status_code == 201, (name, r.text)
    # The check is live: the same serving pod with a privileged container is refused.
    template = copy.deepcopy(deployments["tunehub-serving"]["spec"]["template"])
    template["spec"]["containers"][0]["securityContext"]["privileged"] = True
    r = dry_run_pod(kube, "serving-x", template)
    assert r.status_code == 403
    assert r.json()["message"].startswith(
        'pods "serving-x" is forbidden: violates PodSecurity "restricted:latest": privileged')
    assert kube.objects("pods") == []


def test_the_chart_documents_the_pod_security_label() -> None:
    ((label, level),) = POD_SECURITY.items()
    command = f"kubectl label namespace tunehub {label}={level}"
    assert command in (CHART / "README.md").read_text()
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    assert f"kubectl label namespace {{{{ .Release.Namespace }}}} {label}={level}" in notes


def test_fix_permissions_needs_a_baseline_namespace(kube: KubeCluster) -> None:
    """``data.fixPermissions`` adds a root init container to the hub pod: ``restricted``
    refuses it with the reasons, ``baseline`` (what the chart README asks for then) admits."""
    values = example_values()
    values["data"]["fixPermissions"] = True
    objects = render(values, namespace=kube.namespace)
    for obj in objects:
        if obj["kind"] == "PriorityClass":
            kube.create(obj)
    install_chart_security(kube)
    hub = next(o for o in objects if o["kind"] == "Deployment"
               and o["metadata"]["name"] == "tunehub-hub")["spec"]["template"]
    r = dry_run_pod(kube, "hub-x", hub)
    assert r.status_code == 403, r.text
    assert r.json()["message"] == (
        'pods "hub-x" is forbidden: violates PodSecurity "restricted:latest": unrestricted '
        'capabilities (container "data-permissions" must not include "CHOWN", "DAC_OVERRIDE", '
        '"FOWNER" in securityContext.capabilities.add), runAsNonRoot != true (container '
        '"data-permissions" must not set securityContext.runAsNonRoot=false), runAsUser=0 '
        '(container "data-permissions" must not set runAsUser=0)')
    kube.label_namespace({"pod-security.kubernetes.io/enforce": "baseline"})
    assert dry_run_pod(kube, "hub-x", hub).status_code == 201
