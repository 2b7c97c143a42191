"""The Kubernetes objects of one trial attempt, as plain dicts: a ``batch/v1`` Job, the Secret
holding the trial's token, the NetworkPolicy that makes the attempt a network island, and
(multi-worker trials) a headless Service.

Pure functions of the settings and the launch, so they are tested directly against the
Kubernetes OpenAPI schema. Names are deterministic (``<release>-s<sweep>-t<trial>-a<attempt>``):
creating an attempt twice hits 409 AlreadyExists instead of running it twice, and two releases
in one namespace never name (nor select, :func:`selector`) each other's objects.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shlex
from pathlib import Path
from typing import Any

from tunehub_base.gpu_meter import number_setting
from tuner.backends._base import TrialLaunch
from tuner.backends.kubernetes.settings import KubeSettings
from tuner.sdk.training import ENV_TOKEN
from tuner.spec import Resources

MANAGED_BY = "tunehub"
SWEEP_LABEL = "tunehub.io/sweep"
TRIAL_LABEL = "tunehub.io/trial"
ATTEMPT_LABEL = "tunehub.io/attempt"
OWNER_ANNOTATION = "tunehub.io/owner"
GPUS_ANNOTATION = "tunehub.io/gpus"
LOG_ANNOTATION = "tunehub.io/log-path"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
INSTANCE_LABEL = "app.kubernetes.io/instance"
TF_PORT = 2222
#: A release name used as it is in object names: a DNS-1035 label short enough to leave room
#: for ``-s<sweep>-t<trial>-a<attempt>-<worker>`` within 63 characters (pod hostnames).
_PLAIN_PREFIX = re.compile(r"[a-z]([-a-z0-9]{0,18}[a-z0-9])?")

#: Put before a GPU trial's command: its pod measures its own GPUs and reports them with the
#: trial's token (:mod:`tuner.sdk.gpu_report`), until the trial's shell (``$$``) ends.
GPU_REPORT = "python -m tuner.sdk.gpu_report $$ & "
SAMPLE_ENV = "TUNEHUB_GPU_SAMPLE_SECONDS"


def selector(settings: KubeSettings) -> str:
    """What every list, watch and delete of the backend selects: tunehub's objects of this
    release only (``app.kubernetes.io/instance``), never another release's in the namespace."""
    return f"app.kubernetes.io/managed-by={MANAGED_BY},{INSTANCE_LABEL}={settings.instance}"


def name_prefix(settings: KubeSettings) -> str:
    """The release in object names: the release name itself when it is a short DNS label
    (``tunehub`` by default), else ``th-`` and a digest of it."""
    if _PLAIN_PREFIX.fullmatch(settings.instance):
        return settings.instance
    return "th-" + hashlib.sha256(settings.instance.encode()).hexdigest()[:10]


def job_name(settings: KubeSettings, sweep_id: int, trial_id: int, attempt: int) -> str:
    """Per release: the digits-only parts parsed from the right make the name unambiguous, so
    two releases' names never coincide."""
    return f"{name_prefix(settings)}-s{sweep_id}-t{trial_id}-a{attempt}"


def secret_name(job: str) -> str:
    return f"{job}-token"


def component_labels(settings: KubeSettings, component: str, sweep_id: int,
                     trial_id: int) -> dict[str, str]:
    """The recommended ``app.kubernetes.io/*`` labels of this release's ``component``
    (``trial``, ``serving-cost``) of one trial: every list, watch and cleanup of the backend
    finds it (:func:`selector`, :data:`SWEEP_LABEL`)."""
    return {
        "app.kubernetes.io/name": "tunehub",
        INSTANCE_LABEL: settings.instance,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "tunehub",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        SWEEP_LABEL: str(sweep_id),
        TRIAL_LABEL: str(trial_id),
    }


def labels(settings: KubeSettings, launch: TrialLaunch) -> dict[str, str]:
    """The recommended ``app.kubernetes.io/*`` labels plus what finds the attempt again."""
    return {**component_labels(settings, "trial", launch.sweep_id, launch.trial_id),
            ATTEMPT_LABEL: str(launch.attempt)}


def restricted_container() -> dict[str, Any]:
    """A container's ``securityContext`` under the restricted Pod Security level: no
    privilege escalation, no capability, not root, the runtime's seccomp profile."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def cpu_quantity(cpu: float) -> str:
    """``1.0`` -> ``"1"``, ``0.5`` -> ``"500m"`` (the API's canonical forms)."""
    if float(cpu).is_integer():
        return str(int(cpu))
    return f"{max(1, math.ceil(cpu * 1000))}m"


def node_affinity(settings: KubeSettings, res: Resources, priority: str) -> dict[str, Any] | None:
    """GPU trials without a GPU type: ``low`` priority prefers older types (leaving the newest
    to others), ``high`` prefers the newest; ``normal`` takes whatever is free."""
    if res.gpu == 0 or res.gpu_type or priority == "normal" or len(settings.gpu_types) < 2:
        return None
    by_age = sorted(settings.gpu_types, key=lambda g: g.generation)  # oldest first
    if priority == "high":
        by_age.reverse()
    step = 100 // len(by_age)
    terms = [
        {
            "weight": max(1, 100 - i * step),
            "preference": {
                "matchExpressions": [
                    {"key": settings.gpu_names.product_label, "operator": "In",
                     "values": [gpu.product]}
                ]
            },
        }
        for i, gpu in enumerate(by_age)
    ]
    return {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": terms}}


def tf_config_command(job: str, workers: int, command: str) -> str:
    """A shell line that sets ``TF_CONFIG`` for this worker's index (``JOB_COMPLETION_INDEX``
    of the Indexed Job) and then runs the trial's command."""
    hosts = [f"{job}-{i}.{job}:{TF_PORT}" for i in range(workers)]
    cluster = json.dumps({"worker": hosts}, separators=(",", ":"))
    prefix = '{"cluster":' + cluster + ',"task":{"type":"worker","index":'
    return (
        f"TF_CONFIG={shlex.quote(prefix)}\"$JOB_COMPLETION_INDEX\"'}}}}'; "
        f"export TF_CONFIG; {command}"
    )


def relative_to_data(settings: KubeSettings, path: Path) -> str:
    try:
        return str(path.resolve().relative_to(settings.data_path))
    except ValueError:
        raise ValueError(
            f"{path} is outside the data store {settings.data_path}: the kubernetes backend "
            "needs TUNEHUB_HOME inside TUNEHUB_DATA so trial pods see their working directory"
        ) from None


def sweep_root(workdir: Path) -> Path:
    """The sweep's directory (code snapshot, every trial's directory) of a trial's workdir
    (``<home>/sweeps/<id>/trials/<n>``); a workdir elsewhere stands for itself."""
    return workdir.parent.parent if workdir.parent.name == "trials" else workdir


def data_mounts(settings: KubeSettings, launch: TrialLaunch) -> list[dict[str, Any]]:
    """What a trial pod sees of the data volume: the shared subpaths and its sweep's code
    snapshot read-only, and its own trial directory read-write (working directory, log,
    model output). Nothing else: not the whole volume (tunehub's home, every user's sweeps
    and logs, the registry, other users' areas), and not the sweep's directory either, so no
    directory above its own is the trial's to replace with a link the tuner would follow
    (:mod:`.workdir`)."""
    mounts: list[dict[str, Any]] = [
        {"name": "data", "mountPath": str(settings.data_path / sub), "subPath": sub,
         "readOnly": True}
        for sub in settings.shared_subpaths
    ]
    root = sweep_root(launch.workdir)
    if root != launch.workdir:
        code = root / "code"  # tuner.sweep_store: the snapshot the workdir's links point into
        mounts.append({"name": "data", "mountPath": str(code),
                       "subPath": relative_to_data(settings, code), "readOnly": True})
    mounts.append({"name": "data", "mountPath": str(launch.workdir),
                   "subPath": relative_to_data(settings, launch.workdir)})
    return mounts


def queue_labels(settings: KubeSettings, priority: str) -> dict[str, str]:
    """A Job's Kueue labels (its LocalQueue, its WorkloadPriorityClass), none without Kueue."""
    if not settings.queue:
        return {}
    out = {QUEUE_LABEL: settings.queue}
    workload_class = settings.workload_priority_classes.get(priority)
    if workload_class:
        out[PRIORITY_LABEL] = workload_class  # Kueue orders and preempts by it
    return out


def job(settings: KubeSettings, launch: TrialLaunch) -> dict[str, Any]:
    """The Job of one attempt. ``backoffLimit: 0``: retries belong to the controller."""
    name = job_name(settings, launch.sweep_id, launch.trial_id, launch.attempt)
    res = launch.resources
    meta_labels = {**labels(settings, launch), **queue_labels(settings, launch.priority)}
    pod_labels = {**meta_labels, **settings.pod_labels}
    pod_labels.pop(QUEUE_LABEL, None)  # the Job is the workload, not its pods
    pod_labels.pop(PRIORITY_LABEL, None)
    relative_to_data(settings, launch.workdir)
    env: list[dict[str, Any]] = [
        {"name": k, "value": v} for k, v in sorted(launch.env.items()) if k != ENV_TOKEN
    ]
    if not res.gpu:
        # CPU-only: no GPU even on a GPU node whose runtime exposes all by default.
        env += [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"},
                {"name": "CUDA_VISIBLE_DEVICES", "value": ""}]
    else:  # the pod's GPU readings (GPU_REPORT) at the tuner's sampling period
        env.append({"name": SAMPLE_ENV, "value": f"{number_setting(SAMPLE_ENV):g}"})
    env += [
        {
            "name": ENV_TOKEN,
            "valueFrom": {"secretKeyRef": {"name": secret_name(name), "key": "token"}},
        },
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "HOME", "value": str(launch.workdir)},
    ]
    limits: dict[str, Any] = {"cpu": cpu_quantity(res.cpu), "memory": res.memory}
    requests = dict(limits)
    if settings.ephemeral_storage:
        limits["ephemeral-storage"] = requests["ephemeral-storage"] = settings.ephemeral_storage
    if res.gpu:
        limits[settings.gpu_names.resource] = str(res.gpu)
    command = launch.command
    if res.gpu:
        command = f"{GPU_REPORT}{command}"
    if res.workers > 1:
        command = tf_config_command(name, res.workers, command)
    container: dict[str, Any] = {
        "name": "trial",
        "image": settings.image,
        # args, not command: the image's entrypoint (tini -g -- in tunehub's trial image) stays
        # PID 1 and forwards the kubelet's SIGTERM to the trial's whole process group, so
        # Python gets it through the shell.
        "args": ["/bin/sh", "-c", command],
        "workingDir": str(launch.workdir),
        "env": env,
        "resources": {
            "requests": requests,
            "limits": limits,
        },
        "securityContext": restricted_container(),
        "volumeMounts": data_mounts(settings, launch),
    }
    if res.workers > 1:
        container["ports"] = [{"name": "tf", "containerPort": TF_PORT}]
    if res.gpu > 1:
        # NCCL between GPUs of one pod goes through /dev/shm; the runtime's 64 MiB default
        # fails all-reduce. Memory-backed: it counts against the memory limit.
        container["volumeMounts"].append({"name": "dshm", "mountPath": "/dev/shm"})
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "priorityClassName": settings.priority_classes[launch.priority],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": settings.run_as_user,
            "runAsGroup": settings.run_as_group,
            "fsGroup": settings.run_as_group,
            # Not a recursive chgrp/chmod of the whole shared volume at every trial start,
            # which would also make the tuner's files in it (trial.log) group-writable.
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": settings.data_claim}}
        ],
    }
    if res.gpu > 1:
        pod_spec["volumes"].append(
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": res.memory}})
    if settings.service_account:
        pod_spec["serviceAccountName"] = settings.service_account
    if settings.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in settings.image_pull_secrets]
    if res.gpu:
        pod_spec["tolerations"] = [settings.gpu_names.toleration()]
        if res.gpu_type:
            gpu = settings.gpu_type(res.gpu_type)
            product = gpu.product if gpu is not None else res.gpu_type
            pod_spec["nodeSelector"] = {settings.gpu_names.product_label: product}
    affinity = node_affinity(settings, res, launch.priority)
    if affinity:
        pod_spec["affinity"] = affinity
    if res.workers > 1:
        pod_spec["subdomain"] = name
    spec: dict[str, Any] = {
        "backoffLimit": 0,
        "ttlSecondsAfterFinished": settings.ttl_seconds,
        # A preempted pod (low priority) is replaced by the Job, not counted as a failure.
        "podFailurePolicy": {
            "rules": [
                {
                    "action": "Ignore",
                    "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                }
            ]
        },
        "template": {"metadata": {"labels": pod_labels}, "spec": pod_spec},
    }
    timeout = launch.timeout or settings.default_timeout
    if timeout:
        spec["activeDeadlineSeconds"] = max(1, math.ceil(timeout))
    if res.workers > 1:
        spec.update(
            completionMode="Indexed", completions=res.workers, parallelism=res.workers
        )
    if settings.queue:
        spec["suspend"] = True  # Kueue admits it (gang: all workers or none)
    annotations = {OWNER_ANNOTATION: launch.owner, GPUS_ANNOTATION: str(res.gpu * res.workers)}
    if launch.log_path:
        annotations[LOG_ANNOTATION] = str(launch.log_path)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": meta_labels, "annotations": annotations},
        "spec": spec,
    }


def owner_reference(job_obj: dict[str, Any]) -> dict[str, Any]:
    """Dependents of the Job are garbage-collected with it."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": job_obj["metadata"]["name"],
        "uid": job_obj["metadata"]["uid"],
        "blockOwnerDeletion": False,
    }


def token_secret(
    settings: KubeSettings, launch: TrialLaunch, token: str, owner: dict[str, Any]
) -> dict[str, Any]:
    """The trial's API token, per attempt, owned by its Job."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": secret_name(owner["metadata"]["name"]),
            "labels": labels(settings, launch),
            "ownerReferences": [owner_reference(owner)],
        },
        "stringData": {"token": token},
    }


def island_policy(
    settings: KubeSettings, launch: TrialLaunch, owner: dict[str, Any]
) -> dict[str, Any]:
    """The NetworkPolicy making the attempt its own network island: its pods admit, and may
    open, connections only among themselves, on every port (TensorFlow's gRPC, NCCL's
    ephemeral ports, whatever the trial listens on: no port list to keep up to date).
    Policies add up, so what the release-wide trial policy of the chart allows (egress to
    the tuner's report route, DNS, ``networkPolicy.extraEgress``) still holds; that policy
    admits no ingress to trials, so nobody else reaches the attempt. Owned by the Job: it
    goes with it. Its pods are selected by the Job's name (the label the Job controller
    puts on them) and this release."""
    return job_policy(settings, owner, labels(settings, launch), among_themselves=True)


def job_policy(settings: KubeSettings, owner: dict[str, Any], policy_labels: dict[str, str],
               among_themselves: bool) -> dict[str, Any]:
    """A NetworkPolicy over the pods of Job ``owner`` (selected by the Job's name and this
    release), owned by the Job, both directions governed: with ``among_themselves`` its pods
    admit and open connections only among themselves (a trial's island), without it none at
    all (a measuring pod)."""
    name = owner["metadata"]["name"]
    pods = {"matchLabels": {"batch.kubernetes.io/job-name": name,
                            INSTANCE_LABEL: settings.instance}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": name,
            "labels": policy_labels,
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": {
            "podSelector": pods,
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"podSelector": pods}]}] if among_themselves else [],
            "egress": [{"to": [{"podSelector": pods}]}] if among_themselves else [],
        },
    }


def worker_service(
    settings: KubeSettings, launch: TrialLaunch, owner: dict[str, Any]
) -> dict[str, Any]:
    """Headless Service giving each worker of an Indexed Job a stable name for TF_CONFIG."""
    name = owner["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "labels": labels(settings, launch),
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {"batch.kubernetes.io/job-name": name},
            "ports": [{"name": "tf", "port": TF_PORT, "targetPort": TF_PORT}],
        },
    }
