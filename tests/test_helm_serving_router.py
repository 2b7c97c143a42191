"""The chart's canary router (``serving.canary``): ``tunehub model serve MODEL --upstream`` in
front of the chart's TensorFlow Serving, its flags what the values say (read back through the
CLI's own parser), the registry and database the tuner uses (so its moves are the registry's and
TensorFlow Serving's labels follow), a locked-down pod without a ServiceAccount token, and
NetworkPolicies in which notebooks reach it and it reaches TensorFlow Serving. The router itself
runs for real in ``tests/test_canary_router.py``."""

from __future__ import annotations

import copy
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest

from kubesim import KubeCluster
from tests.chart_security import install_chart_security
from tests.test_chart_security import dry_run_pod
from tests.test_hub_kube_config import (
    CHART,
    NAMESPACE,
    RELEASE,
    example_values,
    find,
    kube_versions,
    minimal_values,
    render,
)

ROUTER = f"{RELEASE}-serving-router"
DB_RULE = {"to": [{"ipBlock": {"cidr": "10.20.0.5/32"}}],
           "ports": [{"protocol": "TCP", "port": 5432}]}


def canary_values(**canary: Any) -> dict[str, Any]:
    values = copy.deepcopy(example_values())
    values["serving"]["canary"] = {"enabled": True, "model": "digits", **canary}
    return values


def router_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    pod = find(objects, "Deployment", ROUTER)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return container


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def component(peer: dict[str, Any]) -> str | None:
    return peer.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/component")


def test_the_router_runs_model_serve_with_the_values_as_flags() -> None:
    from tuner.cli import build_parser

    objects = render(canary_values(share=0.25, requests=500, seconds=600, errorRate=0.01,
                                   latencyMs=50, timeoutSeconds=5))
    router = router_container(objects)
    args = router["args"]
    assert args[:3] == ["python", "-m", "tuner.cli"]
    parsed = build_parser().parse_args(args[3:])  # the CLI takes them as they are rendered
    assert (parsed.name, parsed.host) == ("digits", "0.0.0.0")
    assert (parsed.canary_share, parsed.canary_requests, parsed.canary_seconds) == (0.25, 500,
                                                                                  600.0)
    assert (parsed.canary_error_rate, parsed.canary_latency_ms) == (0.01, 50.0)
    assert parsed.canary_errors is None  # unset: no count bound beside the rate (as the CLI)
    assert parsed.upstream_timeout == 5.0
    # It forwards to the chart's TensorFlow Serving Service, and answers on the same port.
    serving = find(objects, "Service", f"{RELEASE}-serving")["spec"]
    rest = next(p["port"] for p in serving["ports"] if p["name"] == "rest")
    assert parsed.upstream == f"http://{RELEASE}-serving:{rest}"
    assert parsed.port == rest
    service = find(objects, "Service", ROUTER)["spec"]
    assert service["ports"] == [{"name": "rest", "port": rest, "targetPort": "rest"}]
    template = find(objects, "Deployment", ROUTER)["spec"]["template"]
    assert service["selector"].items() <= template["metadata"]["labels"].items()
    # Ready once TensorFlow Serving answers the model's status through it.
    assert router["readinessProbe"]["httpGet"] == {"path": "/v1/models/digits", "port": "rest"}

    # Unset bounds are left to the CLI's defaults; a count bound is passed when given.
    defaults = build_parser().parse_args(router_container(render(canary_values(errors=2)))
                                         ["args"][3:])
    assert (defaults.canary_share, defaults.canary_requests, defaults.canary_errors) == (
        0.1, 100, 2)
    assert (defaults.canary_seconds, defaults.canary_error_rate,
            defaults.canary_latency_ms) == (None, None, None)


def test_the_router_moves_versions_in_the_tuners_registry() -> None:
    objects = render(canary_values())
    router = router_container(objects)
    pod = find(objects, "Deployment", ROUTER)["spec"]["template"]["spec"]
    tuner_pod = find(objects, "Deployment", f"{RELEASE}-tuner")["spec"]["template"]["spec"]
    tuner_env = env_of(tuner_pod["containers"][0])
    env = env_of(router)
    # The same database (the operator's Secret) and registry path as the tuner: the moves
    # are the registry's, and models.config is the very file TensorFlow Serving reads.
    assert env["TUNEHUB_DB_URL"] == tuner_env["TUNEHUB_DB_URL"] == {
        "secretKeyRef": {"name": "tunehub-db", "key": "url"}}
    registry = env["TUNEHUB_REGISTRY"]
    assert registry == tuner_env["TUNEHUB_REGISTRY"]
    serving = find(objects, "Deployment", f"{RELEASE}-serving")["spec"]["template"]["spec"]
    flags = dict(a.removeprefix("--").split("=", 1) for a in serving["containers"][0]["args"])
    assert flags["model_config_file"] == f"{registry}/models.config"
    mounts = {m["mountPath"]: m for m in router["volumeMounts"]}
    serving_mounts = {m["mountPath"]: m for m in serving["containers"][0]["volumeMounts"]}
    assert mounts[registry]["subPath"] == serving_mounts[registry]["subPath"]
    assert mounts[registry]["name"] == serving_mounts[registry]["name"] == "data"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["data"] == {v["name"]: v for v in serving["volumes"]}["data"]
    assert not mounts[registry].get("readOnly")  # it rewrites models.config
    # Written as the tuner writes it (same uid and group); its home is scratch, not the
    # tuner's state (not mounted here).
    for key in ("runAsUser", "runAsGroup", "fsGroup"):
        assert pod["securityContext"][key] == tuner_pod["securityContext"][key], key
    assert env["TUNEHUB_HOME"].startswith("/tmp/") and "/tmp" in mounts
    # No ServiceAccount token, locked down like every pod of the chart, bounded.
    assert pod["automountServiceAccountToken"] is False
    assert pod["enableServiceLinks"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = router["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert router["resources"]["requests"] and router["resources"]["limits"]
    assert pod["priorityClassName"] == tuner_pod["priorityClassName"]  # the serving path


def test_notebooks_reach_the_router_and_the_router_reaches_serving() -> None:
    values = canary_values(databaseEgress=[DB_RULE])
    values["serving"]["restPort"] = 9501  # every rule follows the port
    values["networkPolicy"]["servingFrom"] = [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}}]
    objects = render(values)
    rest = values["serving"]["restPort"]
    policy = find(objects, "NetworkPolicy", ROUTER)["spec"]
    template = find(objects, "Deployment", ROUTER)["spec"]["template"]
    assert policy["podSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    (ingress,) = policy["ingress"]
    assert [component(p) for p in ingress["from"]] == ["notebook", None]
    assert ingress["from"][1] == values["networkPolicy"]["servingFrom"][0]
    assert ingress["ports"] == [{"protocol": "TCP", "port": rest}]
    # With the database's address given, its egress is TensorFlow Serving, DNS and that.
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    to_serving, dns, database = policy["egress"]
    assert [component(p) for p in to_serving["to"]] == ["serving"]
    assert to_serving["ports"] == [{"protocol": "TCP", "port": rest}]
    assert "to" not in dns and {p["port"] for p in dns["ports"]} == {53}
    assert database == DB_RULE
    # TensorFlow Serving admits the router; notebooks may call the router.
    serving = find(objects, "NetworkPolicy", f"{RELEASE}-serving")["spec"]
    callers = {component(p) for rule in serving["ingress"] for p in rule["from"]}
    assert "serving-router" in callers
    notebook = find(objects, "NetworkPolicy", f"{RELEASE}-notebook")["spec"]
    to_router = [r for r in notebook["egress"]
                 if [component(p) for p in r.get("to", [])] == ["serving-router"]]
    assert to_router and to_router[0]["ports"] == [{"protocol": "TCP", "port": rest}]
    # Every selector names pods that exist: the router's own labels.
    labels = template["metadata"]["labels"]
    for sel in (p["podSelector"]["matchLabels"] for rule in serving["ingress"]
                for p in rule["from"] if component(p) == "serving-router"):
        assert sel.items() <= labels.items()

    # Without the database's address the egress is left open (as the tuner's), not cut off.
    open_egress = find(render(canary_values()), "NetworkPolicy", ROUTER)["spec"]
    assert open_egress["policyTypes"] == ["Ingress"] and "egress" not in open_egress


def test_no_router_unless_asked() -> None:
    for objects in (render(example_values()), render(minimal_values())):
        assert [o for o in objects if o["metadata"]["name"] == ROUTER] == []
    notebook = find(render(example_values()), "NetworkPolicy", f"{RELEASE}-notebook")["spec"]
    assert "serving-router" not in {component(p) for r in notebook["egress"]
                                    for p in r.get("to", [])}


def test_the_router_objects_validate_and_lint_strictly() -> None:
    values = canary_values(seconds=60, errors=1, errorRate=0.05, latencyMs=20,
                           databaseEgress=[DB_RULE])
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE)
    assert report["errors"] == [], report
    assert [m for m in report["messages"] if m["severity"] >= 2] == []
    router_objects = [o for o in render(values) if o["metadata"]["name"] == ROUTER]
    assert {o["kind"] for o in router_objects} == {"Service", "Deployment", "NetworkPolicy"}
    for obj in router_objects:
        for version in kube_versions():
            kubernetes_validate.validate(obj, version, strict=True)


def test_the_router_pod_passes_restricted(kube: KubeCluster) -> None:
    """Admitted under the Pod Security level the chart documents, as the emulator enforces
    it (tests/test_chart_security.py does the same for the chart's other pods)."""
    objects = render(canary_values(), namespace=kube.namespace)
    for obj in objects:
        if obj["kind"] == "PriorityClass":
            kube.create(obj)
    install_chart_security(kube)
    template = find(objects, "Deployment", ROUTER)["spec"]["template"]
    r = dry_run_pod(kube, "router-x", template)
    assert r.status_code == 201, r.text


@pytest.mark.parametrize(("canary", "serving_on", "message"), [
    ({"enabled": True}, True, "serving.canary.model"),
    ({"enabled": True, "model": "digits"}, False, "serving.canary.enabled"),
    ({"enabled": True, "model": "digits", "share": 1.5}, True, "/serving/canary/share"),
    ({"enabled": True, "model": "digits", "errorRate": 1}, True, "/serving/canary/errorRate"),
    ({"enabled": True, "model": "Digits!"}, True, "/serving/canary/model"),
    ({"enabled": True, "model": "digits", "shares": 0.1}, True, "shares"),
])
def test_wrong_router_values_are_refused_by_name(canary: dict[str, Any], serving_on: bool,
                                                 message: str) -> None:
    values = copy.deepcopy(example_values())
    values["serving"]["enabled"] = serving_on
    values["serving"]["canary"] = canary
    with pytest.raises(helm.HelmError, match=message):
        render(values)
