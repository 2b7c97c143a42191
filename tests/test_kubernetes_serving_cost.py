"""Promotion under a serving budget on Kubernetes (issue 27): the tuner, which holds a
ServiceAccount token, runs no model; each candidate is measured in a measuring pod it creates
(:mod:`tuner.backends.kubernetes.measuring`), against the API emulator with the chart's tuner
Role in a namespace enforcing the restricted Pod Security level. The real CLI runs the sweep;
the pods (local processes) run the real measuring code on real SavedModels."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from kubesim import KubeCluster
from tests.polling import wait_for
from tests.sweeps_helpers import kube_cli_home, parse_json, write_sweep

pytestmark = pytest.mark.slow

COMPONENT = "app.kubernetes.io/component=serving-cost"

#: Two SavedModels with a serving signature: "small" (1 KB of weights) and "big" (2 MB).
BUILD = """
import sys, tensorflow as tf
for name, width in (("small", 4), ("big", 8192)):
    class Linear(tf.Module):
        def __init__(self):
            self.w = tf.Variable(tf.zeros([64, width]))
        @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32, name="pixels")])
        def __call__(self, x):
            return {"scores": tf.matmul(x, self.w)}
    m = Linear()
    tf.saved_model.save(m, f"{sys.argv[1]}/{name}", signatures={"serving_default": m.__call__})
"""

#: A trial "trains" by copying one of the prepared models; the big one is the more accurate.
TRAIN = """
import os, shutil, tuner
from tuner.sdk.training import artifact_dir
size = tuner.params()["size"]
shutil.copytree(os.path.join(os.environ["MODELS"], size), artifact_dir() / "model")
tuner.report({"val_accuracy": {"small": 0.8, "big": 0.9}[size]})
"""


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built once per module (one TensorFlow import)."""
    where = tmp_path_factory.mktemp("saved-models")
    subprocess.run([sys.executable, "-c", textwrap.dedent(BUILD), str(where)], check=True,
                   timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    return where


def _sweep(kube: KubeCluster, tmp_path: Path, saved_models: Path, sizes: list[str],
           metrics: list[dict[str, str]], **env: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run a budget sweep of ``sizes`` with the CLI on Kubernetes; the sweep's JSON and every
    measuring Job, pod and NetworkPolicy seen while it ran (they are deleted after)."""
    models = kube.data_dir / "datasets" / "models"  # what trial pods see (read-only)
    models.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-r", str(saved_models), str(models)], check=True)
    home = kube_cli_home(kube, tmp_path, **env)
    spec = write_sweep(
        tmp_path / "code", TRAIN, name="budget", trials=len(sizes), parallelism=len(sizes),
        sampler="grid", metric="val_accuracy", env={"MODELS": str(models)},
        space={"size": {"type": "categorical", "choices": sizes}},
        resources={"cpu": 0.5, "memory": "1Gi"},
        metrics=metrics,
        promote={"model": "digits", "policy": "if-better", "constraints": {"size_mb": 1.0}})
    seen: dict[str, dict[str, Any]] = {}
    run = home.popen("sweep", "run", str(spec), "--backend", "kubernetes", "--wait", "--json")

    def ended() -> bool:
        for kind in ("jobs", "pods", "networkpolicies"):
            for obj in kube.objects(kind, label_selector=COMPONENT):
                seen[f"{kind}/{obj['metadata']['name']}"] = obj
        return run.poll() is not None

    try:
        wait_for(ended, 240, "the budget sweep on Kubernetes")
    finally:
        if run.poll() is None:
            run.kill()
    out, err = run.communicate()
    assert run.returncode == 0, out + err
    sweep = parse_json(out)
    assert sweep["state"] == "completed", sweep
    versions = parse_json(home.cli("model", "show", "digits", "--json").stdout or "[]")
    sweep["versions"] = versions
    return sweep, seen


def test_budget_sweep_measures_in_pods_and_promotes_the_model_that_fits(
        kube: KubeCluster, tmp_path: Path, saved_models: Path) -> None:
    sweep, seen = _sweep(kube, tmp_path, saved_models, ["small", "big"],
                         [{"name": "val_accuracy", "direction": "maximize"},
                          {"name": "model_size_mb"}])
    trials = {t["params"]["size"]: t for t in sweep["trials_detail"]}
    for size, t in trials.items():
        assert set(t["metrics"]) == {"val_accuracy", "model_size_mb", "serving_latency_p50_ms",
                                     "serving_latency_p95_ms"}, (size, t)
        assert 0 < t["metrics"]["serving_latency_p50_ms"] <= t["metrics"][
            "serving_latency_p95_ms"]
    assert trials["big"]["metrics"]["model_size_mb"] > 1.0 > trials["small"]["metrics"][
        "model_size_mb"]
    # The more accurate model is over the budget; the one that fits is promoted.
    [version] = sweep["versions"]
    assert version["stage"] == "production"
    assert version["trial_number"] == trials["small"]["number"], (sweep["reason"], version)
    assert "best within the budget" in sweep["reason"], sweep["reason"]

    # One measuring pod per candidate, each as the module says, all gone afterwards.
    jobs = [o for k, o in seen.items() if k.startswith("jobs/")]
    pods = [o for k, o in seen.items() if k.startswith("pods/")]
    policies = [o for k, o in seen.items() if k.startswith("networkpolicies/")]
    assert len(jobs) == 2 and pods and policies, sorted(seen)
    for job in jobs:
        name = job["metadata"]["name"]
        assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 600
        pod = job["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        assert "serviceAccountName" not in pod or pod["serviceAccountName"] == "default"
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        [container] = pod["containers"]
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        [mount] = container["volumeMounts"]
        assert mount["readOnly"] is True and mount["subPath"].startswith(
            ".tunehub/serving-cost/") and mount["subPath"].endswith("/model"), mount
        [volume] = pod["volumes"]
        assert volume["persistentVolumeClaim"]["readOnly"] is True
        limits = container["resources"]["limits"]
        assert limits == container["resources"]["requests"] == {"cpu": "2", "memory": "1Gi"}
        [policy] = [p for p in policies if p["metadata"]["name"] == name]
        assert policy["spec"]["podSelector"]["matchLabels"][
            "batch.kubernetes.io/job-name"] == name
        assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
        assert policy["spec"].get("ingress") == [] and policy["spec"].get("egress") == []
        assert policy["metadata"]["ownerReferences"][0]["name"] == name
    for pod in pods:
        assert pod["spec"]["automountServiceAccountToken"] is False
        assert not any(v.get("projected") for v in pod["spec"]["volumes"]), pod["spec"]
    assert kube.objects("jobs", label_selector=COMPONENT) == []
    # The staged copies are gone; nothing was written in the registry but the version.
    assert list((kube.data_dir / ".tunehub" / "serving-cost").iterdir()) == []
    registry = kube.data_dir / "models" / "digits"
    assert sorted(p.name for p in registry.iterdir() if p.name.isdigit()) == ["1"]


@pytest.mark.parametrize(("setting", "value", "said"), [
    ("TUNEHUB_K8S_MEASURE_MEMORY", "100Mi", "OOMKilled"),
    ("TUNEHUB_K8S_MEASURE_TIMEOUT", "1s",
     "ran past its deadline (TUNEHUB_K8S_MEASURE_TIMEOUT, DeadlineExceeded)"),
], ids=["out-of-memory", "past-its-deadline"])
def test_a_failed_measuring_pod_says_why_and_nothing_is_promoted(
        kube: KubeCluster, tmp_path: Path, saved_models: Path, setting: str, value: str,
        said: str) -> None:
    """The measuring pod's memory cannot hold TensorFlow (OOMKilled), or its deadline is
    shorter than TensorFlow's start (the Job controller's DeadlineExceeded): said on the trial,
    and the model, unmeasured, is not promoted under the budget."""
    sweep, seen = _sweep(kube, tmp_path, saved_models, ["small"],
                         [{"name": "val_accuracy", "direction": "maximize"}],
                         **{setting: value})
    [trial] = sweep["trials_detail"]
    assert trial["state"] == "completed", trial
    assert trial["reason"].startswith("serving cost not measured: the measuring pod "), trial
    assert said in trial["reason"], trial["reason"]
    assert "model_size_mb" not in (trial["metrics"] or {}), trial
    assert sweep["versions"] == [], sweep
    assert "nothing promoted" in sweep["reason"], sweep["reason"]
    assert [o for k, o in seen.items() if k.startswith("jobs/")], sorted(seen)
    assert kube.objects("jobs", label_selector=COMPONENT) == []
    assert list((kube.data_dir / ".tunehub" / "serving-cost").iterdir()) == []
    json.dumps(sweep)  # the reason is plain data for the API


def test_an_evicted_measuring_pod_is_named_with_the_eviction() -> None:
    """A measuring pod preempted (the scheduler's ``DisruptionTarget`` condition, as the
    emulator and a cluster set it) is said as an eviction with its message, not as a failure
    with an exit code; the deadline and a pod's own failure are told apart the same way."""
    from tuner.backends.kubernetes.measuring import KubernetesMeasurer

    evicted = {"metadata": {"name": "m-1-abc"}, "status": {"phase": "Failed", "conditions": [
        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
         "message": "preempted by tunehub/jupyter-ann"}]}}
    assert KubernetesMeasurer._failure("m-1", "BackoffLimitExceeded", [evicted], None) == (
        "the measuring pod m-1 was evicted: preempted by tunehub/jupyter-ann")
    assert "ran past its deadline" in KubernetesMeasurer._failure(
        "m-1", "DeadlineExceeded", [evicted], None)
