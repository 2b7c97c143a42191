"""The chart's measuring pods (serving cost on Kubernetes, issue 27): ``sweeps.servingCost``
reaches the tuner as ``TUNEHUB_K8S_MEASURE_*`` and the backend reads it back; the measuring pod
the tuner would make is not selected by the chart's trial policy (it has no network at all) and
needs no verb beyond the Role's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.test_hub_kube_config import RELEASE, example_values, render
from tuner.backends.kubernetes import cost_pod
from tuner.backends.kubernetes.settings import KubeSettings


def _tuner_settings(objects: list[dict[str, Any]]) -> KubeSettings:
    """The backend's settings from the rendered tuner's plain environment values."""
    [tuner] = [o for o in objects if o["kind"] == "Deployment"
               and o["metadata"]["name"] == f"{RELEASE}-tuner"]
    env = {e["name"]: str(e["value"]) for e in
           tuner["spec"]["template"]["spec"]["containers"][0]["env"] if "value" in e}
    env["TUNEHUB_K8S_NAMESPACE"] = "lab"
    env["TUNEHUB_DB_URL"] = "sqlite://"
    return KubeSettings.from_env(env)


def test_serving_cost_values_reach_the_backend() -> None:
    values = example_values()
    values.setdefault("sweeps", {})["servingCost"] = {"cpu": "1500m", "memory": "3Gi",
                                                      "timeout": "90s"}
    settings = _tuner_settings(render(values))
    assert (settings.measure_cpu, settings.measure_memory, settings.measure_timeout) == (
        "1500m", "3Gi", 90.0)
    defaults = _tuner_settings(render(example_values()))
    assert (defaults.measure_cpu, defaults.measure_memory, defaults.measure_timeout) == (
        "2", "", 600.0)


def test_the_measuring_pod_is_not_a_trial_to_the_charts_policies() -> None:
    objects = render(example_values())
    settings = _tuner_settings(objects)
    model = settings.data_path / ".tunehub" / "serving-cost" / "s1-t2-abc123" / "model"
    job = cost_pod.job(settings, cost_pod.Measurement(1, 2, "alice", model, "abc123",
                                                       memory="1Gi"))
    labels = job["spec"]["template"]["metadata"]["labels"]
    for policy in (o for o in objects if o["kind"] == "NetworkPolicy"):
        wanted = policy["spec"]["podSelector"].get("matchLabels") or {}
        assert not wanted or not wanted.items() <= labels.items(), policy["metadata"]["name"]
    pod = job["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
    assert pod["containers"][0]["volumeMounts"][0]["subPath"] == (
        ".tunehub/serving-cost/s1-t2-abc123/model")
    assert Path(pod["containers"][0]["volumeMounts"][0]["mountPath"]) == model
    policy = cost_pod.no_network(settings, cost_pod.Measurement(1, 2, "alice", model, "abc123"),
                                 {"metadata": {"name": job["metadata"]["name"], "uid": "u"}})
    assert policy["spec"]["ingress"] == [] and policy["spec"]["egress"] == []
