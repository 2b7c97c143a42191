"""Kubernetes mode: KubeSpawner configured from the Helm chart's values.

Why a values file: the chart is the one place an operator describes the lab (GPU types, profiles,
the data volume, priorities). The chart mounts its values into the hub pod as ``values.yaml``
from a Secret, the way zero-to-jupyterhub does, with the names it computed (``Names``,
``Release``) added, and this module turns them into KubeSpawner settings. Nothing is derived
twice: object names come from the chart, not re-guessed here.

Called from ``jupyterhub_config.py`` when ``TUNEHUB_MODE=kubernetes``::

    values = kube.KubeValues(config=c).load()
    kube.configure_kubespawner(c, values)
    profiles = kube.profiles_for_culler(c)
    c.JupyterHub.services = [kube.tuner_service(values)]  # the chart runs the tuner
"""

from __future__ import annotations

import os
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml
from kubernetes.utils.quantity import parse_quantity
from traitlets import Unicode, default
from traitlets.config import Configurable

from hub import notebook
from hub.kube_spawner import TunehubKubeSpawner
from tunehub_base.gpu_names import GpuNames

#: Where the chart mounts its values (the hub Deployment sets TUNEHUB_HUB_VALUES to this).
DEFAULT_VALUES_PATH = "/usr/local/etc/tunehub/values.yaml"
NOTEBOOK_PORT = 8888
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
#: Seconds the starting hub waits for the (external) tuner service to answer; then it warns.
TUNER_STARTUP_WAIT = 2
#: What the notebook image runs (its CMD; images/notebook/Dockerfile).
SINGLEUSER_COMMAND = "jupyterhub-singleuser"



class ValuesError(ValueError):
    """The values file is unusable; the message names the value (``notebooks.profiles[1]...``)."""


class KubeValues(Configurable):
    """Where the hub finds the Helm chart's values in Kubernetes mode."""

    values_file = Unicode(
        help="Path of the chart's values (YAML), mounted from the hub's values Secret "
        f"(TUNEHUB_HUB_VALUES; default {DEFAULT_VALUES_PATH}).",
    ).tag(config=True)

    @default("values_file")
    def _default_values_file(self) -> str:
        return os.environ.get("TUNEHUB_HUB_VALUES") or DEFAULT_VALUES_PATH

    def load(self) -> dict[str, Any]:
        """The values as a dict; a missing or malformed file is a one-line error."""
        path = Path(self.values_file)
        try:
            values = yaml.safe_load(path.read_text())
        except OSError as exc:
            raise ValuesError(f"TUNEHUB_HUB_VALUES: cannot read {path}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ValuesError(f"TUNEHUB_HUB_VALUES: {path} is not YAML: {exc}") from None
        if not isinstance(values, dict) or "Names" not in values:
            raise ValuesError(f"TUNEHUB_HUB_VALUES: {path} is not the tunehub chart's hub values "
                              "(no 'Names'; mount the <release>-hub-values Secret)")
        return values


def prepare_data_dirs(settings: Any, log: Any) -> bool:
    """Create the data store's directories if the hub may; never fail the hub over them.

    Why: on an NFS export whose root is owned by root (fsGroup has no effect there) the hub,
    uid 1000, cannot create them, and a hub that does not start locks everyone out, even the
    admin who could read the message. Logins keep working; spawns that need the user's area say
    what is wrong (:class:`hub.kube_spawner.TunehubKubeSpawner`). Returns whether it worked.
    """
    try:
        settings.ensure_dirs()
    except OSError as exc:
        log.warning("data volume not writable by uid %d (%s): notebooks cannot get their "
                    "areas until it is; set the chart value data.fixPermissions or chown the "
                    "top-level directories to uid 1000 on the file server",
                    os.getuid(), exc)
        return False
    return True


def cpu(quantity: Any, field: str) -> float:
    """A Kubernetes CPU quantity ("500m", 2, "1.5") in cores, as KubeSpawner wants it."""
    return float(_parse(quantity, field))


def memory(quantity: Any, field: str) -> int:
    """A Kubernetes memory quantity ("4Gi", "512M", 1e9) in bytes, as KubeSpawner wants it."""
    return int(_parse(quantity, field))


def _parse(quantity: Any, field: str) -> Decimal:
    try:
        return parse_quantity(quantity)
    except ValueError:
        raise ValuesError(f"{field}: {quantity!r} is not a Kubernetes quantity") from None


def gpu_inventory(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``gpuTypes`` by name: what the spawner checks a GPU request against."""
    return {g["name"]: dict(g) for g in values.get("gpuTypes") or []}


def profile_list(values: dict[str, Any]) -> list[dict[str, Any]]:
    """KubeSpawner profiles from ``notebooks.profiles``.

    Each profile keeps our own keys (``slug``, ``gpus``, ``gpu_type``, ``groups``, ``default``)
    next to KubeSpawner's (``display_name``, ``description``, ``kubespawner_override``):
    the culler reads ``gpus``, the spawner filters by ``groups`` and checks ``gpu_type``.
    """
    inventory = gpu_inventory(values)
    names = GpuNames.from_values(values)
    out = []
    for i, p in enumerate(values["notebooks"]["profiles"]):
        where = f"notebooks.profiles[{i}]"
        gpus = int(p.get("gpus") or 0)
        override: dict[str, Any] = {}
        if p.get("image"):
            override["image"] = p["image"]
        for key, convert in (("cpu", cpu), ("memory", memory)):
            if key in p:
                prefix = "mem" if key == "memory" else "cpu"
                override[f"{prefix}_guarantee"] = convert(p[key]["guarantee"],
                                                          f"{where}.{key}.guarantee")
                override[f"{prefix}_limit"] = convert(p[key]["limit"], f"{where}.{key}.limit")
        gpu_type = p.get("gpuType") or ""
        if gpu_type and gpu_type not in inventory:
            known = ", ".join(inventory) or "none configured"
            raise ValuesError(f"{where}.gpuType: {gpu_type!r} is not in gpuTypes ({known})")
        if gpus:
            override["extra_resource_limits"] = {names.resource: str(gpus)}
            override["tolerations"] = [names.toleration()]
            if gpu_type:
                override["node_selector"] = {names.product_label: inventory[gpu_type]["product"]}
        else:
            # Images built on CUDA bases set NVIDIA_VISIBLE_DEVICES=all; with the NVIDIA runtime
            # as the node default a CPU-only pod would otherwise see every GPU of its node.
            override["environment"] = {"NVIDIA_VISIBLE_DEVICES": "none"}
        out.append({
            "slug": p["slug"],
            "display_name": p["displayName"],
            "description": p.get("description", ""),
            "default": bool(p.get("default")),
            "gpus": gpus,
            "gpu_type": gpu_type,
            "groups": list(p.get("groups") or []),
            "kubespawner_override": override,
        })
    if not out:
        raise ValuesError("notebooks.profiles: at least one profile is needed")
    return out


def data_volumes(values: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Volumes and mounts of a notebook pod: the shared data store at ``data.mountPath``
    (datasets and the model registry read-only, the user's own area writable) and a
    memory-backed ``/dev/shm`` (the container runtime's 64 MiB default starves data loaders)."""
    data = values["data"]
    root = data["mountPath"].rstrip("/")
    users = data["usersSubPath"].strip("/")
    volumes = [
        {"name": "data", "persistentVolumeClaim": {"claimName": values["Names"]["dataClaim"]}},
        {"name": "dshm", "emptyDir": {"medium": "Memory",
                                      "sizeLimit": str(values["notebooks"]["shmSize"])}},
    ]
    mounts = [
        {"name": "data", "mountPath": f"{root}/{data['datasetsSubPath']}",
         "subPath": data["datasetsSubPath"], "readOnly": True},
        {"name": "data", "mountPath": f"{root}/{data['modelsSubPath']}",
         "subPath": data["modelsSubPath"], "readOnly": True},
        {"name": "data", "mountPath": f"{root}/{users}/{{username}}",
         "subPath": f"{users}/{{username}}"},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    return volumes, mounts


def configure_kubespawner(c: Any, values: dict[str, Any] | None = None) -> None:
    """Set the hub (external proxy, in-cluster addresses) and KubeSpawner from the values."""
    if values is None:
        values = KubeValues(config=c).load()
    names, release = values["Names"], values["Release"]
    hub_port = int(values["hub"]["port"])
    nb = values["notebooks"]

    # --- the hub inside the cluster: the proxy is its own Deployment ---------------------------
    c.JupyterHub.hub_bind_url = f"http://:{hub_port}"
    c.JupyterHub.hub_connect_url = f"http://{names['hub']}:{hub_port}"
    c.ConfigurableHTTPProxy.should_start = False
    c.ConfigurableHTTPProxy.api_url = f"http://{names['proxyApi']}:8001"
    # A `helm upgrade` may bring a newer JupyterHub: migrate its database on start (for SQLite
    # JupyterHub keeps a backup copy first), as zero-to-jupyterhub does.
    c.JupyterHub.upgrade_db = True
    # Notebook pods outlive a hub restart or upgrade (the hub re-attaches to them).
    c.JupyterHub.cleanup_servers = False
    # Notebooks reach the tuner inside the cluster, not through the public URL.
    c.Spawner.environment.update({
        notebook.ENV_API_URL: f"http://{names['tuner']}:{values['tuner']['port']}/services/tuner/"
    })

    # --- KubeSpawner ------------------------------------------------------------------------
    c.JupyterHub.spawner_class = TunehubKubeSpawner
    ks = c.TunehubKubeSpawner
    ks.namespace = release["Namespace"]
    image = values["images"]["notebook"]
    ks.image = f"{image['repository']}:{image['tag']}"
    ks.image_pull_policy = image.get("pullPolicy") or "IfNotPresent"
    ks.image_pull_secrets = list(values.get("imagePullSecrets") or [])
    ks.port = NOTEBOOK_PORT
    # With the image's CMD (KubeSpawner's default) KubeSpawner drops every argument, tunehub's
    # server extension among them (hub.notebook.SINGLEUSER_ARGS): name the command.
    ks.cmd = [SINGLEUSER_COMMAND]
    ks.start_timeout = int(nb["startTimeout"])
    ks.unschedulable_timeout = int(nb["unschedulableTimeout"])
    ks.http_timeout = 120
    ks.events_enabled = True  # scheduling and image-pull events on the spawn progress page
    ks.priority_class_name = names["notebookPriorityClass"]
    ks.automount_service_account_token = False  # a notebook has no business with the API
    ks.service_account = None
    ks.common_labels = {
        # The chart's name (honouring nameOverride): what its NetworkPolicies select.
        "app.kubernetes.io/name": names.get("name") or "tunehub",
        "app.kubernetes.io/instance": release["Name"],
        "app.kubernetes.io/managed-by": "kubespawner",
    }
    ks.component_label = "notebook"  # what the chart's NetworkPolicies select
    if nb.get("jupyterlabNews"):  # notebook.configure turned the news off, as in every mode
        c.Spawner.args = [a for a in c.Spawner.args if a not in notebook.NO_LAB_NEWS_ARGS]
    if names.get("localQueue"):
        # kueue.queueNotebooks: Kueue's pod integration admits notebook pods from the same
        # quota as sweeps, so notebook GPUs count against the pool.
        ks.extra_labels = {QUEUE_LABEL: names["localQueue"]}
        ks.kueue_cluster_queue = names.get("clusterQueue") or ""
        if names.get("notebookWorkloadPriorityClass"):
            # Kueue orders (and preempts) by it: notebooks above every sweep.
            ks.extra_labels[PRIORITY_LABEL] = names["notebookWorkloadPriorityClass"]
    # Non-root, no privilege escalation, no capabilities, RuntimeDefault seccomp.
    ks.uid = int(nb["uid"])
    ks.gid = int(nb["gid"])
    ks.fs_gid = int(nb["gid"])
    ks.allow_privilege_escalation = False
    ks.pod_security_context = {"runAsNonRoot": True,
                               "fsGroupChangePolicy": "OnRootMismatch",
                               "seccompProfile": {"type": "RuntimeDefault"}}
    # Service links would put e.g. TUNEHUB_TUNER_PORT=tcp://... (from the Service
    # <release>-tuner) into the notebook's environment, clashing with tunehub's settings.
    ks.extra_pod_config = {"enableServiceLinks": False}
    ks.container_security_context = {"capabilities": {"drop": ["ALL"]}}
    volumes, mounts = data_volumes(values)
    ks.volumes = volumes
    ks.volume_mounts = mounts
    ks.notebook_dir = values["data"]["mountPath"]
    ks.storage_pvc_ensure = False  # no per-user PVC: the shared RWX claim holds user areas

    profiles = profile_list(values)
    ks.profiles = profiles
    ks.gpu_types = list(gpu_inventory(values).values())
    ks.data_path = values["data"]["mountPath"]
    ks.users_subpath = values["data"]["usersSubPath"]
    ks.profile_list = TunehubKubeSpawner.visible_profiles


def tuner_service(values: dict[str, Any] | None = None,
                  environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The tuner as an *external* hub service: in Kubernetes mode it runs in its own
    Deployment (the chart's ``<release>-tuner``), so the hub must not start it; the hub and the
    tuner share the API token (key ``tuner-token`` of the ``<release>-tokens`` Secret, or of
    ``hub.existingSecret``): ``TUNEHUB_TUNER_API_TOKEN`` in the hub, ``JUPYTERHUB_API_TOKEN``
    in the tuner."""
    from hub import tuner_service as ts

    if values is None:
        values = KubeValues().load()
    env = os.environ if environ is None else environ
    token = env.get("TUNEHUB_TUNER_API_TOKEN")
    if not token:
        raise ValuesError("TUNEHUB_TUNER_API_TOKEN: not set (the chart sets it from the "
                          "tuner-token key of the <release>-tokens Secret)")
    url = f"http://{values['Names']['tuner']}:{values['tuner']['port']}"
    service = ts.service_definition(url, {})
    for key in ("command", "environment"):
        service.pop(key, None)
    service["api_token"] = token
    # At startup the hub waits this long for an external service to answer before it adds its
    # proxy routes and reports itself running; the tuner's own Deployment may still be starting
    # (install, upgrade), and nothing in the hub needs it up: don't hold the hub 30 s for it.
    service["timeout"] = TUNER_STARTUP_WAIT
    return service


def profiles_for_culler(c: Any) -> list[dict[str, Any]]:
    """The profiles in the shape the idle culler wants (``slug``, ``gpus``, ``default``)."""
    return [
        {"slug": p["slug"], "gpus": p["gpus"], "default": p["default"]}
        for p in c.TunehubKubeSpawner.profiles
    ]
