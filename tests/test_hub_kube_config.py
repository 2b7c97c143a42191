"""Kubernetes mode of the hub: ``jupyterhub_config.py`` fed with the values the Helm chart renders
into the hub's values Secret yields the KubeSpawner settings those values describe, and the pod
KubeSpawner builds from them is valid Kubernetes (strict OpenAPI schema).

The chart is rendered with the real Helm engine (helm-python-sdk); the helpers here are shared
with ``tests/test_helm.py``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import major_minor
from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "helm" / "tunehub"
GPU_EXAMPLE = CHART / "examples" / "gpu-values.yaml"
RELEASE, NAMESPACE = "tunehub", "lab"
TUNER_TOKEN = "tuner-token-0123456789abcdef"


def kube_versions(count: int = 2) -> list[str]:
    """The newest ``count`` Kubernetes minor versions kubernetes-validate ships schemas for."""
    minors = sorted({major_minor(v) for v in kubernetes_validate.utils.all_versions()},
                    key=lambda v: tuple(int(x) for x in v.split(".")))
    return minors[-count:]


def example_values() -> dict[str, Any]:
    return yaml.safe_load(GPU_EXAMPLE.read_text())


def minimal_values() -> dict[str, Any]:
    """The least an install needs: the database Secret and a ReadWriteMany data volume."""
    return {"db": {"existingSecret": "tunehub-db"}, "data": {"storageClassName": "nfs-client"}}


def parse_manifests(out: dict[str, str]) -> list[dict[str, Any]]:
    """Objects of Helm's rendered templates (NOTES.txt left out)."""
    objects = []
    for path, text in sorted(out.items()):
        if path.endswith(".txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def cluster_prefix(namespace: str = NAMESPACE, release: str = RELEASE) -> str:
    """The chart's prefix of cluster-scoped names (``tunehub.clusterPrefix``): the fullname
    and a digest of namespace/release, unique per install."""
    import hashlib

    return f"{release}-{hashlib.sha256(f'{namespace}/{release}'.encode()).hexdigest()[:8]}"


def render(values: dict[str, Any] | None = None, namespace: str = NAMESPACE,
           release: str = RELEASE) -> list[dict[str, Any]]:
    """Every object the chart renders with ``values`` (schema-checked by Helm)."""
    with helm.Chart.load(CHART) as chart:
        out = chart.render(values, name=release, namespace=namespace, is_install=True)
    return parse_manifests(out)


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} rendered"
    return matches[0]


def hub_values(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The values file the hub pod reads: the hub values Secret's ``values.yaml``."""
    secret, = (o for o in objects if o["kind"] == "Secret"
               and o["metadata"]["name"].endswith("-hub-values"))
    return yaml.safe_load(secret["stringData"]["values.yaml"])


def load_hub_config(values: dict[str, Any], tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Config:
    """Run the repository's ``jupyterhub_config.py`` in Kubernetes mode on ``values`` (written
    where TUNEHUB_HUB_VALUES points), exactly as JupyterHub loads it."""
    path = tmp / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    monkeypatch.setenv("TUNEHUB_MODE", "kubernetes")
    monkeypatch.setenv("TUNEHUB_HUB_VALUES", str(path))
    monkeypatch.setenv("TUNEHUB_HOME", str(tmp / "home"))
    monkeypatch.setenv("TUNEHUB_DATA", str(tmp / "data"))
    monkeypatch.setenv("TUNEHUB_HUB_STATE", str(tmp / "state"))
    monkeypatch.setenv("TUNEHUB_TUNER_API_TOKEN", TUNER_TOKEN)  # from the tuner-token Secret
    return PyFileConfigLoader("jupyterhub_config.py", path=str(REPO)).load_config()


def rendered_hub_config(values: dict[str, Any] | None, tmp: Path,
                        monkeypatch: pytest.MonkeyPatch, namespace: str = NAMESPACE
                        ) -> tuple[list[dict[str, Any]], dict[str, Any], Config]:
    """Render the chart, take the hub's values from it, load the hub config from those."""
    objects = render(values, namespace)
    hv = hub_values(objects)
    return objects, hv, load_hub_config(hv, tmp, monkeypatch)


def assert_kubespawner_matches(c: Config, hv: dict[str, Any],
                               objects: list[dict[str, Any]]) -> None:
    """The KubeSpawner settings in ``c`` are what the values ``hv`` describe."""
    from kubespawner import KubeSpawner

    from hub.kube_spawner import TunehubKubeSpawner

    assert c.JupyterHub.spawner_class is TunehubKubeSpawner
    assert issubclass(TunehubKubeSpawner, KubeSpawner)
    ks = c.TunehubKubeSpawner
    names = hv["Names"]
    inventory = {g["name"]: g for g in hv.get("gpuTypes") or []}

    assert ks.namespace == NAMESPACE
    nb_image = hv["images"]["notebook"]
    assert ks.image == f"{nb_image['repository']}:{nb_image['tag']}"
    assert ks.events_enabled is True
    assert ks.automount_service_account_token is False
    assert ks.uid == hv["notebooks"]["uid"] and ks.uid != 0
    # The priority class is one the chart creates.
    assert ks.priority_class_name == names["notebookPriorityClass"]
    find(objects, "PriorityClass", ks.priority_class_name)
    assert ks.profile_list == TunehubKubeSpawner.visible_profiles

    by_slug = {p["slug"]: p for p in ks.profiles}
    assert list(by_slug) == [p["slug"] for p in hv["notebooks"]["profiles"]]
    for p in hv["notebooks"]["profiles"]:
        got = by_slug[p["slug"]]
        override = got["kubespawner_override"]
        assert got["display_name"] == p["displayName"]
        assert got["groups"] == p.get("groups", [])
        gpus = p.get("gpus", 0)
        assert got["gpus"] == gpus
        if gpus:
            assert override["extra_resource_limits"] == {"nvidia.com/gpu": str(gpus)}
        else:
            assert "extra_resource_limits" not in override
        if p.get("gpuType"):
            assert override["node_selector"] == {
                "nvidia.com/gpu.product": inventory[p["gpuType"]]["product"]}
        else:
            assert "node_selector" not in override
        assert override.get("image") == (p.get("image") or None)

    claim = {v["name"]: v for v in ks.volumes}["data"]["persistentVolumeClaim"]["claimName"]
    assert claim == names["dataClaim"]
    pvcs = {o["metadata"]["name"]: o for o in objects if o["kind"] == "PersistentVolumeClaim"}
    if not hv["data"].get("existingClaim"):
        assert pvcs[claim]["spec"]["accessModes"] == ["ReadWriteMany"]
    shm = {v["name"]: v for v in ks.volumes}["dshm"]["emptyDir"]
    assert shm == {"medium": "Memory", "sizeLimit": str(hv["notebooks"]["shmSize"])}
    mounts = {m["mountPath"]: m for m in ks.volume_mounts}
    root, data = hv["data"]["mountPath"], hv["data"]
    assert mounts[f"{root}/{data['datasetsSubPath']}"]["readOnly"] is True
    user_area = mounts[f"{root}/{data['usersSubPath']}/{{username}}"]
    assert user_area["subPath"] == f"{data['usersSubPath']}/{{username}}"
    assert not user_area.get("readOnly")
    assert mounts["/dev/shm"]["name"] == "dshm"


def test_gpu_example_gives_the_kubespawner_settings_it_describes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    objects, hv, c = rendered_hub_config(example_values(), tmp_path, monkeypatch)
    assert_kubespawner_matches(c, hv, objects)
    # Spot checks against the example file itself, not just self-consistency.
    profiles = {p["slug"]: p["kubespawner_override"] for p in c.TunehubKubeSpawner.profiles}
    assert profiles["a100-2"]["extra_resource_limits"] == {"nvidia.com/gpu": "2"}
    assert profiles["a100-2"]["node_selector"] == {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert profiles["a100-2"]["image"] == "registry.example.com/tunehub/notebook:0.1.0-tf2.17"
    assert profiles["t4-1"]["mem_limit"] == 16 * 2**30
    assert profiles["cpu"]["environment"] == {"NVIDIA_VISIBLE_DEVICES": "none"}
    assert c.TunehubKubeSpawner.unschedulable_timeout == 120
    # The hub talks to the chart's proxy and is reachable at its Service.
    assert c.ConfigurableHTTPProxy.should_start is False
    assert c.ConfigurableHTTPProxy.api_url == "http://tunehub-proxy-api:8001"
    assert c.JupyterHub.hub_connect_url == "http://tunehub-hub:8081"
    find(objects, "Service", "tunehub-proxy-api")
    find(objects, "Service", "tunehub-hub")
    # The tuner is the chart's own Deployment: an external service sharing the chart's token.
    tuner = next(s for s in c.JupyterHub.services if s["name"] == "tuner")
    assert "command" not in tuner and "environment" not in tuner
    assert tuner["url"] == "http://tunehub-tuner:8082"
    assert tuner["api_token"] == TUNER_TOKEN
    # The culler learns which profiles hold GPUs.
    culler = next(s for s in c.JupyterHub.services if s["name"] == "idle-culler")
    assert "--GpuAwareCuller.gpu_profiles=['t4-1', 'a100-2', 'a100-8']" in culler["command"]


def test_default_values_give_a_cpu_lab(tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    objects, hv, c = rendered_hub_config(minimal_values(), tmp_path, monkeypatch)
    assert_kubespawner_matches(c, hv, objects)
    assert [p["slug"] for p in c.TunehubKubeSpawner.profiles] == ["cpu"]
    assert c.TunehubKubeSpawner.gpu_types == []


def test_profile_with_unknown_gpu_type_is_refused_by_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    values = example_values()
    values["notebooks"]["profiles"][1]["gpuType"] = "h100"
    hv = hub_values(render(values))
    with pytest.raises(ValueError, match=r"notebooks\.profiles\[1\]\.gpuType: 'h100'"):
        load_hub_config(hv, tmp_path, monkeypatch)


# --- the spawner built from that config ---------------------------------------------------------

def hub_user(name: str, groups: list[str], admin: bool = False) -> Any:
    """A JupyterHub user (ORM row in an in-memory hub database, wrapped as the hub does)."""
    from jupyterhub import orm
    from jupyterhub.user import User

    db = orm.new_session_factory("sqlite://")()
    row = orm.User(name=name, admin=admin)
    db.add(row)
    for g in groups:
        row.groups.append(orm.Group(name=g))
    db.commit()
    return User(row, settings={})


def make_spawner(c: Config, user: Any, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch,
                 **options: str) -> Any:
    """The hub's spawner for ``user`` with ``options`` chosen on the spawn page; it talks to
    the API server in ``kubeconfig`` (call inside a running event loop)."""
    import kubespawner.clients
    from jupyterhub.objects import Hub
    from kubernetes_asyncio.config import kube_config

    from hub.kube_spawner import TunehubKubeSpawner

    # KubeSpawner loads the default kubeconfig; kubernetes-asyncio read $KUBECONFIG at import.
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    # KubeSpawner shares pod/event reflectors per class across the process; each test has its
    # own cluster, so it gets its own (and its own API clients).
    monkeypatch.setattr(TunehubKubeSpawner, "reflectors", {})
    monkeypatch.setattr(kubespawner.clients, "_client_cache", {})
    kubespawner.clients.load_config.cache_clear()  # KubeSpawner loads the kubeconfig once
    spawner = TunehubKubeSpawner(config=c, user=user, hub=Hub(), name="")
    spawner.user_options = dict(options)
    return spawner


def strict_validate(obj: dict[str, Any]) -> None:
    for version in kube_versions():
        kubernetes_validate.validate(obj, version, strict=True)


async def test_notebook_pod_manifest_is_valid_and_carries_the_profile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kube: Any) -> None:
    _, hv, c = rendered_hub_config(example_values(), tmp_path, monkeypatch)
    spawner = make_spawner(c, hub_user("alice", ["research"]), kube.kubeconfig, monkeypatch,
                           profile="a100-2")
    await spawner.load_user_options()
    pod = spawner.api.api_client.sanitize_for_serialization(await spawner.get_pod_manifest())
    strict_validate(pod)

    spec = pod["spec"]
    nb = spec["containers"][0]
    assert nb["image"] == "registry.example.com/tunehub/notebook:0.1.0-tf2.17"
    # The image's CMD named, so tunehub's server arguments are not dropped by KubeSpawner.
    assert nb["args"][0] == "jupyterhub-singleuser"
    assert "--ServerApp.jpserver_extensions={'hub.singleuser.busy_activity': True}" in nb["args"]
    assert nb["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert spec["priorityClassName"] == f"{cluster_prefix(NAMESPACE)}-notebook-1000"
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert nb["securityContext"]["allowPrivilegeEscalation"] is False
    assert nb["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert nb["securityContext"]["runAsUser"] == 1000
    mounts = {m["mountPath"]: m for m in nb["volumeMounts"]}
    root = hv["data"]["mountPath"]
    assert mounts[f"{root}/datasets"]["readOnly"] is True
    assert mounts[f"{root}/users/alice"]["subPath"] == "users/alice"
    assert mounts["/dev/shm"]["name"] == "dshm"
    claims = [v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"]
              if "persistentVolumeClaim" in v]
    assert claims == ["tunehub-data"]
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "notebook"
    assert pod["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    env = {e["name"]: e.get("value") for e in nb["env"]}
    assert env["TUNEHUB_API_URL"] == "http://tunehub-tuner:8082/services/tuner/"


async def test_profiles_are_limited_to_groups(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kube: Any) -> None:
    from hub.kube_spawner import SpawnRefused, TunehubKubeSpawner

    _, _, c = rendered_hub_config(example_values(), tmp_path, monkeypatch)
    seen = {}
    for name, groups, admin in (("bob", [], False), ("rita", ["research"], False),
                                ("ada", [], True)):
        spawner = make_spawner(c, hub_user(name, groups, admin), kube.kubeconfig, monkeypatch)
        seen[name] = [p["slug"] for p in TunehubKubeSpawner.visible_profiles(spawner)]
    assert seen == {"bob": ["cpu", "t4-1"], "rita": ["cpu", "t4-1", "a100-2"],
                    "ada": ["cpu", "t4-1", "a100-2", "a100-8"]}
    spawner = make_spawner(c, hub_user("bob", []), kube.kubeconfig, monkeypatch,
                           profile="a100-2")
    with pytest.raises(SpawnRefused, match="'a100-2' is not available to you"):
        await spawner.load_user_options()


async def test_gpu_request_no_node_can_hold_is_refused_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kube: Any) -> None:
    from hub.kube_spawner import SpawnRefused

    values = example_values()
    values["gpuTypes"][1]["maxPerNode"] = 2  # a100 nodes hold 2; the research profile asks 4
    values["notebooks"]["profiles"][2]["gpus"] = 4
    _, _, c = rendered_hub_config(values, tmp_path, monkeypatch)
    spawner = make_spawner(c, hub_user("rita", ["research"]), kube.kubeconfig, monkeypatch,
                           profile="a100-2")
    with pytest.raises(SpawnRefused) as refused:
        await spawner.start()
    assert str(refused.value) == ("cannot start '2 × A100 (research)': no node has 4 × "
                                  "NVIDIA-A100-SXM4-80GB GPUs; the largest has 2")
    assert kube.objects("pods", namespace=kube.namespace) == []


async def test_unschedulable_pod_fails_with_the_schedulers_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kube: Any) -> None:
    """The values claim 8-GPU A100 nodes; the cluster's only A100 node has 2. The spawn must
    fail with the scheduler's message long before start_timeout, not hang."""
    objects, _, c = rendered_hub_config(example_values(), tmp_path, monkeypatch)
    for obj in objects:
        if obj["kind"] == "PriorityClass":
            kube.create(obj)
    c.TunehubKubeSpawner.namespace = kube.namespace
    c.TunehubKubeSpawner.unschedulable_timeout = 3
    c.TunehubKubeSpawner.start_timeout = 120
    spawner = make_spawner(c, hub_user("pat", ["platform"]), kube.kubeconfig, monkeypatch,
                           profile="a100-8")
    loop = asyncio.get_running_loop()
    began = loop.time()
    from hub.kube_spawner import SpawnRefused

    with pytest.raises(SpawnRefused, match=r"no node can take this server \(0/3 nodes are "
                                           r"available.*Insufficient nvidia.com/gpu"):
        await spawner.start()
    assert loop.time() - began < 60
    # The refused pod does not stay queued (its PriorityClass would let it preempt later).
    assert kube.objects("pods", namespace=kube.namespace) == []


def test_scheduling_events_decide_hope() -> None:
    from hub.kube_spawner import unschedulable_reason

    failed = {"reason": "FailedScheduling", "type": "Warning",
              "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}
    assert unschedulable_reason([failed]) == failed["message"]
    assert unschedulable_reason([failed, {"reason": "Scheduled"}]) is None
    assert unschedulable_reason([{"reason": "Scheduled"}, failed]) == failed["message"]
    # The autoscaler is adding a node: keep waiting even while the scheduler still complains.
    assert unschedulable_reason([failed, {"reason": "TriggeredScaleUp"}, failed]) is None
    assert unschedulable_reason([]) is None


def test_tuner_is_an_external_service_with_the_charts_token() -> None:
    from hub.kube import ValuesError, tuner_service

    hv = hub_values(render(example_values()))
    service = tuner_service(hv, {"TUNEHUB_TUNER_API_TOKEN": "t0ken"})
    assert service["name"] == "tuner" and service["api_token"] == "t0ken"
    assert service["url"] == "http://tunehub-tuner:8082"
    assert "command" not in service  # the chart's tuner Deployment runs it, not the hub
    assert service["timeout"] <= 5  # a tuner still starting does not hold up the hub
    with pytest.raises(ValuesError, match="TUNEHUB_TUNER_API_TOKEN"):
        tuner_service(hv, {})


async def test_spawn_on_the_emulated_cluster_lands_on_the_chosen_gpu_type(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kube: Any,
        unused_tcp_port: int) -> None:
    """A real KubeSpawner start against the API emulator (schema-validating, with a scheduler
    and a kubelet stand-in): the chart's PriorityClass is honoured, the pod goes to the A100
    node, the hub has created the user's writable area on the data volume, and the server
    answers. The server command is a plain HTTP server: this tests the pod, not JupyterLab."""
    import secrets
    import sys
    from urllib.parse import urlparse

    import httpx

    from kubesim.waiting import eventually

    values = example_values()
    values["data"]["mountPath"] = str(kube.data_dir)  # the harness exposes claims in place
    (kube.data_dir / "datasets").mkdir(parents=True)
    (kube.data_dir / "datasets" / "digits.csv").write_text("0,1\n")
    objects, _, c = rendered_hub_config(values, tmp_path, monkeypatch, namespace=kube.namespace)
    for obj in objects:
        if obj["kind"] == "PriorityClass":
            kube.create(obj)
    port = unused_tcp_port
    c.TunehubKubeSpawner.port = port
    c.TunehubKubeSpawner.cmd = [sys.executable, "-m", "http.server", str(port),
                                "--directory", str(kube.data_dir)]
    c.Spawner.args = []
    spawner = make_spawner(c, hub_user("rita", ["research"]), kube.kubeconfig, monkeypatch,
                           profile="a100-2")
    spawner.api_token = secrets.token_hex(16)
    try:
        url = urlparse(await spawner.start())
        ip = url.hostname
        assert url.port == port
        pod = kube.get("pods", spawner.pod_name, namespace=kube.namespace)
        assert pod["spec"]["nodeName"] == "gpu-a100-0"
        notebook_class = f"{cluster_prefix(kube.namespace)}-notebook-1000"
        assert pod["spec"]["priority"] == values_priority(objects, notebook_class)
        assert (kube.data_dir / "users" / "rita").is_dir()

        async def answers() -> bool:
            try:
                async with httpx.AsyncClient() as http:
                    r = await http.get(f"http://{ip}:{port}/datasets/")
                return r.status_code == 200 and "digits.csv" in r.text
            except httpx.HTTPError:
                return False

        await eventually(answers, 30, "the notebook pod to serve the datasets")
        messages = [e["message"] async for e in _progress(spawner)]
        assert any("gpu-a100-0" in m for m in messages), messages
    finally:
        await spawner.stop(now=True)


def values_priority(objects: list[dict[str, Any]], name: str) -> int:
    return find(objects, "PriorityClass", name)["value"]


async def _progress(spawner: Any) -> Any:
    """The spawn-page progress events KubeSpawner streams (start has finished, so it ends)."""
    async for event in spawner.progress():
        yield event


# --- logins ---------------------------------------------------------------------------------

OIDC = {
    "JupyterHub": {"authenticator_class": "generic-oauth"},
    "GenericOAuthenticator": {
        "client_id": "tunehub", "client_secret": "s3cret-from-the-idp",
        "oauth_callback_url": "https://lab.example.com/hub/oauth_callback",
        "authorize_url": "https://idp.example.com/realms/lab/protocol/openid-connect/auth",
        "token_url": "https://idp.example.com/realms/lab/protocol/openid-connect/token",
        "userdata_url": "https://idp.example.com/realms/lab/protocol/openid-connect/userinfo",
        "scope": ["openid", "email", "groups"], "username_claim": "email",
        "allowed_groups": ["lab"], "admin_groups": ["lab-admins"], "manage_groups": True,
        "admin_users": ["ops@example.com"],
    },
}
GITHUB = {
    "JupyterHub": {"authenticator_class": "github"},
    "GitHubOAuthenticator": {"client_id": "Iv1.abc", "client_secret": "gh-secret",
                             "oauth_callback_url": "https://lab.example.com/hub/oauth_callback",
                             "allowed_organizations": ["example-org:ml-team"]},
}


def hub_env(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    deployment = find(objects, "Deployment", f"{RELEASE}-hub")
    return {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize(("config", "section", "cls_name"), [
    (OIDC, "GenericOAuthenticator", "GenericOAuthenticator"),
    (GITHUB, "GitHubOAuthenticator", "GitHubOAuthenticator"),
])
def test_authenticator_from_values_is_what_the_hub_loads(
        config: dict[str, Any], section: str, cls_name: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """hub.config (zero-to-jupyterhub's way) reaches the hub: JupyterHub resolves the
    authenticator by its entry-point name and the instance carries every setting."""
    from jupyterhub.app import JupyterHub

    values = example_values()
    values["hub"]["config"] = config
    objects, hv, c = rendered_hub_config(values, tmp_path, monkeypatch)
    assert hv["hub"]["config"] == config  # in the hub's values Secret, not a ConfigMap
    # No local admin when another authenticator logs people in.
    assert "TUNEHUB_ADMIN_PASSWORD" not in hub_env(objects)
    assert not [o for o in objects if o["kind"] == "Secret"
                and o["metadata"]["name"] == f"{RELEASE}-hub-admin"]
    assert c.JupyterHub.template_vars["tunehub_accounts"] is False

    hub = JupyterHub(config=c)
    authenticator = hub.authenticator_class(config=c)
    assert type(authenticator).__name__ == cls_name
    for trait, value in config[section].items():
        got = getattr(authenticator, trait)
        assert (sorted(got) if isinstance(got, set) else got) == (
            sorted(value) if isinstance(value, list) and isinstance(got, set) else value), trait
    admins = next(r for r in c.JupyterHub.load_roles if r["name"] == "tuner-admin")["users"]
    assert admins == sorted(config[section].get("admin_users", []))
    assert hub.upgrade_db is True  # a helm upgrade migrates JupyterHub's database
    if config[section].get("manage_groups"):  # groups from the IdP: JupyterHub forbids both
        assert not c.JupyterHub.load_groups


def test_first_admin_comes_from_the_secret_and_follows_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The chart passes the admin Secret as TUNEHUB_ADMIN_*; every hub start makes the account
    match it, so rotating the Secret is how a lost password is replaced."""
    from tunehub_base.accounts import AccountStore

    objects = render(example_values())
    env = hub_env(objects)
    assert env["TUNEHUB_ADMIN_USER"]["value"] == "admin"
    ref = env["TUNEHUB_ADMIN_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": f"{RELEASE}-hub-admin", "key": "password"}
    assert len(find(objects, "Secret", ref["name"])["data"]["password"]) >= 24
    hv = hub_values(objects)
    accounts = tmp_path / "state" / "accounts.json"
    for password in ("first-generated-pw-1", "rotated-in-the-secret-2"):
        monkeypatch.setenv("TUNEHUB_ADMIN_USER", "admin")
        monkeypatch.setenv("TUNEHUB_ADMIN_PASSWORD", password)
        c = load_hub_config(hv, tmp_path, monkeypatch)
        store = AccountStore(accounts)
        assert store.verify("admin", password) is not None
        assert store.get("admin").admin is True
        assert c.JupyterHub.template_vars["tunehub_accounts"] is True
        assert "admin" in next(r for r in c.JupyterHub.load_roles
                               if r["name"] == "tuner-admin")["users"]
    assert AccountStore(accounts).verify("admin", "first-generated-pw-1") is None
    # An operator-managed Secret is referenced, never generated.
    values = example_values()
    values["auth"] = {"admin": {"name": "ops", "existingSecret": "lab-admin",
                                "passwordKey": "pw"}}
    objects = render(values)
    env = hub_env(objects)
    assert env["TUNEHUB_ADMIN_USER"]["value"] == "ops"
    assert env["TUNEHUB_ADMIN_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "lab-admin", "key": "pw"}
    assert not [o for o in objects if o["kind"] == "Secret" and "admin" in o["metadata"]["name"]]


def test_jupyterlab_news_is_off_unless_asked_for(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from hub.notebook import NO_LAB_NEWS_ARGS

    _, _, c = rendered_hub_config(example_values(), tmp_path, monkeypatch)
    assert set(NO_LAB_NEWS_ARGS) <= set(c.Spawner.args)
    values = example_values()
    values["notebooks"]["jupyterlabNews"] = True
    _, _, c = rendered_hub_config(values, tmp_path, monkeypatch)
    assert not set(NO_LAB_NEWS_ARGS) & set(c.Spawner.args)


def test_a_data_volume_the_hub_cannot_write_does_not_stop_the_hub(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """An NFS root owned by root (fsGroup ignored): the hub config still loads, so people can
    log in, and the log names the fix. (/sys refuses mkdir even to root, like such an export
    refuses uid 1000.)"""
    hv = hub_values(render(example_values()))
    monkeypatch.setenv("TUNEHUB_ADMIN_USER", "admin")
    monkeypatch.setenv("TUNEHUB_ADMIN_PASSWORD", "a-password-from-the-secret")
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(hv))
    for name, value in (("TUNEHUB_MODE", "kubernetes"), ("TUNEHUB_HUB_VALUES", str(path)),
                        ("TUNEHUB_HOME", "/sys/tunehub-nfs/.tunehub"),
                        ("TUNEHUB_DATA", "/sys/tunehub-nfs"),
                        ("TUNEHUB_HUB_STATE", str(tmp_path / "state")),
                        ("TUNEHUB_TUNER_API_TOKEN", TUNER_TOKEN)):
        monkeypatch.setenv(name, value)
    with caplog.at_level("WARNING", logger="JupyterHub"):
        c = PyFileConfigLoader("jupyterhub_config.py", path=str(REPO)).load_config()
    assert c.JupyterHub.spawner_class.__name__ == "TunehubKubeSpawner"
    assert "data volume not writable by uid" in caplog.text
    assert "data.fixPermissions" in caplog.text


async def test_spawn_without_a_writable_user_area_is_refused_with_the_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kube: Any) -> None:
    from hub.kube_spawner import SpawnRefused

    _, _, c = rendered_hub_config(example_values(), tmp_path, monkeypatch)
    # The volume is mounted (a directory) but refuses new entries, as /sys does even to root.
    c.TunehubKubeSpawner.data_path = "/sys"
    c.TunehubKubeSpawner.users_subpath = "tunehub-users"
    spawner = make_spawner(c, hub_user("alice", []), kube.kubeconfig, monkeypatch)
    with pytest.raises(SpawnRefused, match=r"cannot create your data area "
                                           r"/sys/tunehub-users/alice: .*data.fixPermissions"):
        await spawner.load_user_options()


def test_oauth_client_secret_from_an_operators_secret(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """GitOps: no credential in the values; the hub gets OAUTH_CLIENT_SECRET from a Secret and
    OAuthenticator picks it up."""
    from jupyterhub.app import JupyterHub

    values = example_values()
    settings = {k: v for k, v in OIDC["GenericOAuthenticator"].items() if k != "client_secret"}
    values["hub"]["config"] = {**OIDC, "GenericOAuthenticator": settings}
    values["hub"]["extraSecretEnv"] = {"OAUTH_CLIENT_SECRET": {"name": "idp", "key": "secret"}}
    objects, hv, c = rendered_hub_config(values, tmp_path, monkeypatch)
    assert hub_env(objects)["OAUTH_CLIENT_SECRET"]["valueFrom"] == {
        "secretKeyRef": {"name": "idp", "key": "secret"}}
    assert "client_secret" not in str(hv)
    monkeypatch.setenv("OAUTH_CLIENT_SECRET", "from-the-secret")  # what the kubelet sets
    authenticator = JupyterHub(config=c).authenticator_class(config=c)
    assert authenticator.client_secret == "from-the-secret"
