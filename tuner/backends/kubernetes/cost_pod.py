"""The Kubernetes objects of one serving-cost measurement: a ``batch/v1`` Job whose one pod
measures a candidate model by itself (:mod:`tuner.serving.cost_report`), and the
NetworkPolicy that cuts that pod off the network.

Pure functions of the settings and the measurement, tested against the OpenAPI schema and the
restricted Pod Security level like the trials' (:mod:`.manifests`). The pod:

- runs the trial image's tunehub (the same measuring code as on one machine), non-root, no
  privilege escalation, no capability, the runtime's seccomp profile;
- has no ServiceAccount token (``automountServiceAccountToken: false``, the namespace's
  default account, never the trials' ``TUNEHUB_K8S_SERVICE_ACCOUNT``) and no Service links;
- sees of the data volume only the staged copy of the model, read-only (the claim and the
  mount both say so), mounted where the tuner sees it;
- has the CPU and memory of ``TUNEHUB_K8S_MEASURE_*`` (requests equal limits: a fixed budget)
  and ``activeDeadlineSeconds`` of ``TUNEHUB_K8S_MEASURE_TIMEOUT``;
- is labelled ``app.kubernetes.io/component: serving-cost``, not ``trial``: the chart's trial
  policy (egress to the tuner) does not select it, and its own policy admits no ingress and
  allows no egress, since it reports through its log, which the tuner reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.backends.kubernetes import manifests as m
from tuner.backends.kubernetes.settings import KubeSettings
from tuner.serving.cost import CostMethod
from tuner.serving.cost_report import method_args

COMPONENT = "serving-cost"
CONTAINER = "measure"


@dataclass(frozen=True)
class Measurement:
    """One measuring pod: the trial whose model it measures, the staged copy it mounts
    (inside the data store), and ``tag`` (a few random hex digits: a measurement made again,
    after a tuner restart, never meets an older one's Job)."""

    sweep_id: int
    trial_id: int
    owner: str
    model_dir: Path
    tag: str
    priority: str = "normal"
    memory: str = "2Gi"
    method: CostMethod = CostMethod()


def job_name(settings: KubeSettings, measurement: Measurement) -> str:
    return (f"{m.name_prefix(settings)}-s{measurement.sweep_id}-t{measurement.trial_id}"
            f"-cost-{measurement.tag}")


def job(settings: KubeSettings, measurement: Measurement) -> dict[str, Any]:
    """The measuring Job. ``backoffLimit: 0``: a failed measurement is reported, not retried."""
    name = job_name(settings, measurement)
    labels = m.component_labels(settings, COMPONENT, measurement.sweep_id, measurement.trial_id)
    model = measurement.model_dir
    budget: dict[str, Any] = {"cpu": settings.measure_cpu,
                              "memory": settings.measure_memory or measurement.memory}
    if settings.ephemeral_storage:
        budget["ephemeral-storage"] = settings.ephemeral_storage
    container = {
        "name": CONTAINER,
        "image": settings.image,
        "args": ["python", "-m", "tuner.serving.cost_report", str(model),
                 *method_args(measurement.method)],
        "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"},
                {"name": "CUDA_VISIBLE_DEVICES", "value": ""},
                {"name": "TF_CPP_MIN_LOG_LEVEL", "value": "2"},
                {"name": "PYTHONUNBUFFERED", "value": "1"},
                {"name": "HOME", "value": "/tmp"}],
        "resources": {"requests": dict(budget), "limits": dict(budget)},
        "securityContext": m.restricted_container(),
        "volumeMounts": [{"name": "model", "mountPath": str(model), "readOnly": True,
                          "subPath": m.relative_to_data(settings, model)}],
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "priorityClassName": settings.priority_classes[measurement.priority],
        "terminationGracePeriodSeconds": 5,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": settings.run_as_user,
            "runAsGroup": settings.run_as_group,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [{"name": "model", "persistentVolumeClaim": {
            "claimName": settings.data_claim, "readOnly": True}}],
    }
    if settings.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in settings.image_pull_secrets]
    spec: dict[str, Any] = {
        "backoffLimit": 0,
        "activeDeadlineSeconds": max(1, math.ceil(settings.measure_timeout)),
        # The tuner deletes it once read; this removes it if the tuner died meanwhile.
        "ttlSecondsAfterFinished": settings.ttl_seconds,
        "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
    }
    if settings.queue:
        spec["suspend"] = True  # Kueue admits it against the namespace's quota, as a trial
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name,
                     "labels": {**labels, **m.queue_labels(settings, measurement.priority)},
                     "annotations": {m.OWNER_ANNOTATION: measurement.owner}},
        "spec": spec,
    }


def no_network(settings: KubeSettings, measurement: Measurement,
               owner: dict[str, Any]) -> dict[str, Any]:
    """The measuring pod's NetworkPolicy: both directions governed, no rule: nothing reaches
    it, it reaches nothing (its server listens on a Unix socket inside it). Owned by its Job."""
    labels = m.component_labels(settings, COMPONENT, measurement.sweep_id,
                                measurement.trial_id)
    return m.job_policy(settings, owner, labels, among_themselves=False)
