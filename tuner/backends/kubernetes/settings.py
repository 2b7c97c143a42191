"""Settings of the Kubernetes backend, read once from the environment.

The Helm chart (``helm/tunehub/templates/tuner.yaml``) sets these on the tuner; outside a
cluster, set them yourself and point ``KUBECONFIG`` at a cluster.

==================================== =====================================================
``KUBECONFIG`` / ``TUNEHUB_K8S_CONTEXT`` kubeconfig file and context; without a kubeconfig
                                     the in-cluster service account is used
``TUNEHUB_K8S_NAMESPACE``            namespace of trial Jobs (default: the kubeconfig
                                     context's namespace, else the pod's own, else
                                     ``default``)
``TUNEHUB_K8S_IMAGE``                trial image (default ``tunehub/trial:0.1.0``)
``TUNEHUB_K8S_DATA_CLAIM``           PersistentVolumeClaim of the shared data store,
                                     mounted at ``TUNEHUB_DATA`` (default ``tunehub-data``)
``TUNEHUB_K8S_SHARED_SUBPATHS``     comma-separated directories of the data volume
                                     trial pods see read-only (default ``datasets``);
                                     besides them a pod sees only its own sweep
``TUNEHUB_K8S_GPU_TYPES``            JSON list, or the path of a YAML/JSON file holding
                                     it: ``[{"name": "a100", "product":
                                     "NVIDIA-A100-SXM4-80GB", "generation": 2,
                                     "maxPerNode": 8}]``. ``product`` is the nodes'
                                     ``nvidia.com/gpu.product`` label, ``generation``
                                     the age order (higher is newer), ``maxPerNode`` the
                                     most GPUs of the type on one node (used when the
                                     tuner may not read Nodes)
``TUNEHUB_K8S_GPU_RESOURCE``,        how the cluster names GPUs: the extended resource,
``TUNEHUB_K8S_GPU_PRODUCT_LABEL``,   the nodes' GPU model label and the GPU nodes' taint
``TUNEHUB_K8S_GPU_TAINT_KEY``        key (defaults: :class:`tunehub_base.gpu_names.GpuNames`,
                                     the chart's ``gpuNames``)
``TUNEHUB_K8S_QUEUE``                Kueue LocalQueue; set: Jobs start suspended with
                                     ``kueue.x-k8s.io/queue-name`` (default: none)
``TUNEHUB_K8S_CLUSTER_QUEUE``        the LocalQueue's ClusterQueue, named in a waiting
                                     trial's reason (default: the LocalQueue is named)
``TUNEHUB_K8S_PRIORITY_CLASSES``     JSON ``{"low": ..., "normal": ..., "high": ...}``
                                     (default ``tunehub-sweep-<priority>``)
``TUNEHUB_K8S_WORKLOAD_PRIORITY_CLASSES`` the same for Kueue's WorkloadPriorityClasses: a
                                     queued Job carries ``kueue.x-k8s.io/priority-class``
                                     (default: none, Kueue then orders by the
                                     PriorityClass value)
``TUNEHUB_K8S_POD_LABELS``           JSON map of extra labels on trial pods
                                     (e.g. for NetworkPolicies)
``TUNEHUB_K8S_MAX_GPUS_PER_USER``    GPUs one user's trials may hold at once (0: no cap)
``TUNEHUB_K8S_MAX_TRIALS_PER_USER``  trials one user may run at once (0: no cap)
``TUNEHUB_K8S_TRIAL_TIMEOUT``        ``activeDeadlineSeconds`` of sweeps without a
                                     ``trial_timeout`` (``2h``; default: none)
``TUNEHUB_K8S_IMAGE_PULL_SECRETS``   JSON list of Secret names (or ``{"name": ...}``)
``TUNEHUB_K8S_SERVICE_ACCOUNT``      service account of trial pods (default: namespace's)
``TUNEHUB_K8S_RUN_AS_USER`` / ``_GROUP`` uid / gid of trial processes (1000 / 100); the uid
                                     must not be the tuner's own (refused): a trial
                                     may never write as the process that reads its
                                     directory. The tuner must be in the group (the
                                     chart's ``fsGroup``) to hand it the trial's directory
``TUNEHUB_K8S_TTL_SECONDS``          ``ttlSecondsAfterFinished`` (default 3600)
``TUNEHUB_K8S_UNSCHEDULABLE_TIMEOUT`` seconds a pod may stay unschedulable before the
                                     attempt fails with the scheduler's message (0 fails
                                     at once); unset or empty (the default): it waits
                                     its turn, with the scheduler's message as its reason
``TUNEHUB_K8S_INSTANCE``             ``app.kubernetes.io/instance`` (default ``tunehub``)
``TUNEHUB_K8S_EPHEMERAL_STORAGE``    ephemeral-storage request and limit of a trial pod, so
                                     one trial filling the node's disk is evicted alone
                                     (default: none; a Kueue ClusterQueue must cover it)
``TUNEHUB_K8S_MEASURE_CPU``          CPU request and limit of a measuring pod (serving
                                     cost, :mod:`.measuring`; default ``2``: the server
                                     pinned to one, the timing client on the other)
``TUNEHUB_K8S_MEASURE_MEMORY``       its memory (default: the sweep's
                                     ``resources.memory``, what the model was trained in)
``TUNEHUB_K8S_MEASURE_TIMEOUT``      its ``activeDeadlineSeconds`` (``10m``; the tuner gives
                                     up on it 2 minutes after that)
==================================== =====================================================
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tunehub_base.gpu_names import GpuNames
from tunehub_base.settings import load_settings
from tuner.spec import PRIORITIES, SpecError, parse_duration

IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True)
class GpuType:
    """One kind of GPU in the pool. ``generation``: higher is newer."""

    name: str
    product: str
    generation: int = 0
    max_per_node: int | None = None


@dataclass(frozen=True)
class KubeSettings:
    namespace: str
    data_path: Path
    image: str = "tunehub/trial:0.1.0"
    data_claim: str = "tunehub-data"
    shared_subpaths: tuple[str, ...] = ("datasets",)
    gpu_types: tuple[GpuType, ...] = ()
    gpu_names: GpuNames = GpuNames()
    queue: str = ""
    cluster_queue: str = ""
    workload_priority_classes: Mapping[str, str] = field(default_factory=dict)
    priority_classes: Mapping[str, str] = field(
        default_factory=lambda: {p: f"tunehub-sweep-{p}" for p in PRIORITIES}
    )
    pod_labels: Mapping[str, str] = field(default_factory=dict)
    max_gpus_per_user: int = 0
    max_trials_per_user: int = 0
    default_timeout: float | None = None
    image_pull_secrets: tuple[str, ...] = ()
    service_account: str = ""
    run_as_user: int = 1000
    run_as_group: int = 100
    ttl_seconds: int = 3600
    #: None: an unschedulable pod waits (its attempt says why) until the cluster has room
    unschedulable_timeout: float | None = None
    instance: str = "tunehub"
    ephemeral_storage: str = ""
    measure_cpu: str = "2"
    #: Empty: the sweep's ``resources.memory``.
    measure_memory: str = ""
    measure_timeout: float = 600.0
    kubeconfig: str | None = None
    context: str | None = None

    def gpu_type(self, name: str) -> GpuType | None:
        """A GPU type by its short name or its node label value."""
        for gpu in self.gpu_types:
            if name in (gpu.name, gpu.product):
                return gpu
        return None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> KubeSettings:
        """Read the ``TUNEHUB_K8S_*`` variables (see the module docstring); a bad value
        raises :class:`SpecError` naming the variable."""
        env = os.environ if environ is None else environ
        kubeconfig = env.get("KUBECONFIG") or None
        context = env.get("TUNEHUB_K8S_CONTEXT") or None
        namespace = env.get("TUNEHUB_K8S_NAMESPACE") or _default_namespace(kubeconfig, context)
        timeout = env.get("TUNEHUB_K8S_TRIAL_TIMEOUT") or None
        classes = {p: f"tunehub-sweep-{p}" for p in PRIORITIES}
        classes.update(_json_map(env, "TUNEHUB_K8S_PRIORITY_CLASSES"))
        run_as_user = _int(env, "TUNEHUB_K8S_RUN_AS_USER", 1000, minimum=1)
        if run_as_user == os.geteuid():
            raise SpecError("TUNEHUB_K8S_RUN_AS_USER", f"{run_as_user} is the tuner's own uid; "
                            "trials must run as another uid (the chart's sweeps.runAsUser)")
        return cls(
            namespace=namespace,
            data_path=load_settings(dict(env)).data,
            image=env.get("TUNEHUB_K8S_IMAGE") or cls.image,
            data_claim=env.get("TUNEHUB_K8S_DATA_CLAIM") or cls.data_claim,
            shared_subpaths=_subpaths(env.get("TUNEHUB_K8S_SHARED_SUBPATHS", "datasets")),
            gpu_types=_gpu_types(env.get("TUNEHUB_K8S_GPU_TYPES", "")),
            gpu_names=GpuNames.from_env(env),
            queue=env.get("TUNEHUB_K8S_QUEUE", ""),
            cluster_queue=env.get("TUNEHUB_K8S_CLUSTER_QUEUE", ""),
            workload_priority_classes=_json_map(env, "TUNEHUB_K8S_WORKLOAD_PRIORITY_CLASSES"),
            priority_classes=classes,
            pod_labels=_json_map(env, "TUNEHUB_K8S_POD_LABELS"),
            max_gpus_per_user=_int(env, "TUNEHUB_K8S_MAX_GPUS_PER_USER", 0),
            max_trials_per_user=_int(env, "TUNEHUB_K8S_MAX_TRIALS_PER_USER", 0),
            default_timeout=parse_duration(timeout, "TUNEHUB_K8S_TRIAL_TIMEOUT"),
            image_pull_secrets=_pull_secrets(env.get("TUNEHUB_K8S_IMAGE_PULL_SECRETS", "")),
            service_account=env.get("TUNEHUB_K8S_SERVICE_ACCOUNT", ""),
            run_as_user=run_as_user,
            run_as_group=_int(env, "TUNEHUB_K8S_RUN_AS_GROUP", 100),
            ttl_seconds=_int(env, "TUNEHUB_K8S_TTL_SECONDS", 3600),
            unschedulable_timeout=(
                float(_int(env, "TUNEHUB_K8S_UNSCHEDULABLE_TIMEOUT", 0))
                if env.get("TUNEHUB_K8S_UNSCHEDULABLE_TIMEOUT", "") != "" else None),
            instance=env.get("TUNEHUB_K8S_INSTANCE") or cls.instance,
            ephemeral_storage=env.get("TUNEHUB_K8S_EPHEMERAL_STORAGE") or cls.ephemeral_storage,
            measure_cpu=env.get("TUNEHUB_K8S_MEASURE_CPU") or cls.measure_cpu,
            measure_memory=env.get("TUNEHUB_K8S_MEASURE_MEMORY") or cls.measure_memory,
            measure_timeout=parse_duration(env.get("TUNEHUB_K8S_MEASURE_TIMEOUT") or "10m",
                                           "TUNEHUB_K8S_MEASURE_TIMEOUT") or cls.measure_timeout,
            kubeconfig=kubeconfig,
            context=context,
        )


def _subpaths(raw: str) -> tuple[str, ...]:
    parts = tuple(p.strip().strip("/") for p in raw.split(",") if p.strip().strip("/"))
    for p in parts:
        if ".." in Path(p).parts or Path(p).is_absolute():
            raise SpecError("TUNEHUB_K8S_SHARED_SUBPATHS",
                            f"expected directories inside the data volume, got {p!r}")
    return parts


def _default_namespace(kubeconfig: str | None, context: str | None) -> str:
    """The kubeconfig context's namespace, else the pod's own namespace, else default."""
    path = Path(kubeconfig.split(os.pathsep)[0]) if kubeconfig else Path.home() / ".kube/config"
    try:
        config = yaml.safe_load(path.read_text()) or {}
        wanted = context or config.get("current-context")
        for ctx in config.get("contexts") or []:
            if ctx.get("name") == wanted:
                return str((ctx.get("context") or {}).get("namespace") or "default")
    except (OSError, yaml.YAMLError, AttributeError):
        pass
    try:
        return IN_CLUSTER_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def _int(env: Mapping[str, str], key: str, default: int, minimum: int = 0) -> int:
    raw = env.get(key, "")
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SpecError(key, f"expected an integer, got {raw!r}") from None
    if value < minimum:
        raise SpecError(key, f"must be at least {minimum}, got {value}")
    return value


def _json_map(env: Mapping[str, str], key: str) -> dict[str, str]:
    raw = env.get(key, "")
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        raise SpecError(key, "expected a JSON object") from None
    if not isinstance(value, dict):
        raise SpecError(key, "expected a JSON object")
    return {str(k): str(v) for k, v in value.items()}


def _pull_secrets(raw: str) -> tuple[str, ...]:
    if not raw:
        return ()
    try:
        value = json.loads(raw)
    except ValueError:
        raise SpecError("TUNEHUB_K8S_IMAGE_PULL_SECRETS", "expected a JSON list") from None
    if not isinstance(value, list):
        raise SpecError("TUNEHUB_K8S_IMAGE_PULL_SECRETS", "expected a JSON list")
    return tuple(str(v["name"] if isinstance(v, dict) else v) for v in value)


def _gpu_types(raw: str) -> tuple[GpuType, ...]:
    """JSON text, or the path of a YAML/JSON file (a list, or a mapping with ``gpuTypes``)."""
    key = "TUNEHUB_K8S_GPU_TYPES"
    raw = raw.strip()
    if not raw:
        return ()
    data: Any
    if raw[0] in "[{":
        try:
            data = json.loads(raw)
        except ValueError:
            raise SpecError(key, "expected a JSON list or the path of a YAML file") from None
    else:
        try:
            data = yaml.safe_load(Path(raw).read_text())
        except OSError as exc:
            raise SpecError(key, f"cannot read {raw}: {exc.strerror}") from None
        except yaml.YAMLError:
            raise SpecError(key, f"{raw} is not valid YAML") from None
    if isinstance(data, dict):
        data = data.get("gpuTypes", data.get("gpu_types"))
    if not isinstance(data, list):
        raise SpecError(key, "expected a list of {name, product, generation, maxPerNode}")
    types = []
    for i, item in enumerate(data):
        if not isinstance(item, dict) or not item.get("name") or not item.get("product"):
            raise SpecError(f"{key}[{i}]", "needs a name and a product (the node label value)")
        per_node = item.get("maxPerNode", item.get("max_per_node"))
        generation = item.get("generation") or 0
        if not isinstance(generation, int | float) or (
            per_node is not None and not isinstance(per_node, int)
        ):
            raise SpecError(f"{key}[{i}]", "generation and maxPerNode are numbers")
        types.append(
            GpuType(str(item["name"]), str(item["product"]), math.floor(generation), per_node)
        )
    return tuple(types)
