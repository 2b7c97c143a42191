"""Kubernetes mode end to end: the real JupyterHub, configured by this repository's
``jupyterhub_config.py`` from what the Helm chart gives the hub pod (the rendered hub values
Secret and the hub Deployment's environment, its secrets resolved from the rendered Secrets),
behind configurable-http-proxy started as the chart's proxy Deployment starts it, spawns notebook
pods on the Kubernetes API emulator (``kubesim``: schema validation, scheduler, a kubelet
stand-in that runs the pod's command as a local process).

Only what the emulator cannot provide differs from a cluster, in :data:`HUB_OVERRIDES` and
:func:`local_proxy_command`: there is no cluster DNS (Service names become 127.0.0.1), pods
share the host's ports (free ports instead of 8000/8001/8888) and run as the test's user, root
(``--allow-root``). The tuner is the chart's own Deployment, which does not run here: the hub
must tolerate its external service being unreachable.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from kubesim import KubeCluster
from tests.chart_security import HUB_ACCOUNT, hub_kubeconfig, install_chart_security
from tests.oidc_provider import OidcProvider
from tests.polling import wait_for
from tests.service_fixtures import free_port
from tests.test_hub_kube_config import (
    RELEASE,
    example_values,
    find,
    hub_values,
    render,
)
from tests.test_hub_platform import login_token

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DRIVER_TOKEN = "test-driver-token-0123456789abcdef"

#: The hub's config file: the repository's, then what the emulated cluster cannot do.
HUB_OVERRIDES = '''
import os

c = get_config()  # noqa: F821
load_subconfig(os.environ["T_REPO_CONFIG"])  # noqa: F821 -- the chart's hub runs exactly this

# No cluster DNS here: the chart's Service names (<release>-hub, <release>-proxy-api) do not
# resolve, and every "pod" is 127.0.0.1.
c.JupyterHub.hub_connect_url = os.environ["T_HUB_CONNECT_URL"]
c.ConfigurableHTTPProxy.api_url = os.environ["T_PROXY_API_URL"]
# Pods share the host's ports: a free one instead of 8888.
c.TunehubKubeSpawner.port = int(os.environ["T_NOTEBOOK_PORT"])
# Pods run as the test's user (root here, uid 1000 in the chart); Jupyter refuses root without it.
c.Spawner.args.append("--allow-root")
# The chart keeps the 90 s default; the test does not wait that long for a refusal.
c.TunehubKubeSpawner.unschedulable_timeout = 3

# The test drives the hub through its REST API with this service's token.
c.JupyterHub.services.append({"name": "test-driver", "api_token": os.environ["T_DRIVER_TOKEN"]})
c.JupyterHub.load_roles.append({
    "name": "test-driver", "services": ["test-driver"],
    "scopes": ["admin:users", "admin:servers", "access:servers", "admin:groups"],
})
'''


def resolve_env(container: dict[str, Any], objects: list[dict[str, Any]],
                namespace: str) -> dict[str, str]:
    """A rendered container's environment as the kubelet would give it (values, Secret keys,
    the pod's namespace)."""
    env: dict[str, str] = {}
    for var in container.get("env") or []:
        source = var.get("valueFrom")
        if source is None:
            env[var["name"]] = str(var.get("value", ""))
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            secret = find(objects, "Secret", ref["name"])
            if ref["key"] in (secret.get("stringData") or {}):
                env[var["name"]] = secret["stringData"][ref["key"]]
            else:
                env[var["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
        elif source.get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
            env[var["name"]] = namespace
        else:
            raise AssertionError(f"env {var['name']}: unsupported source {source}")
    return env


def local_proxy_command(objects: list[dict[str, Any]], port: int, api_port: int,
                        hub_port: int) -> list[str]:
    """The chart's proxy command with the emulator's addresses (no DNS, shared ports)."""
    deployment = find(objects, "Deployment", f"{RELEASE}-proxy")
    command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[0] == "configurable-http-proxy"
    local = {"--ip": "127.0.0.1", "--api-ip": "127.0.0.1", "--port": str(port),
             "--api-port": str(api_port)}
    argv = [str(BIN / "configurable-http-proxy")]
    for arg in command[1:]:
        name, _, value = arg.partition("=")
        value = local.get(name, value).replace(f"http://{RELEASE}-hub:", "http://127.0.0.1:")
        argv.append(f"{name}={value}")
    assert f"--default-target=http://127.0.0.1:{hub_port}" in argv, argv
    return argv


@dataclass
class ChartHub:
    """The hub and proxy of a chart install on the emulated cluster."""

    url: str  # the proxy's public URL
    kube: KubeCluster
    tmp: Path
    env: dict[str, str]
    proxy_argv: list[str]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"token {DRIVER_TOKEN}"}

    def start(self) -> ChartHub:
        for name, argv in (("proxy", self.proxy_argv),
                           ("hub", [str(BIN / "jupyterhub"), "--config",
                                    str(self.tmp / "hub_config.py")])):
            with (self.tmp / f"{name}.log").open("wb") as log:
                self.procs.append(subprocess.Popen(
                    argv, cwd=self.tmp, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True))
        self.wait(self._up, 90, "the hub to finish starting and answer through the proxy")
        return self

    def _up(self) -> bool:
        for proc in self.procs:
            if proc.poll() is not None:
                raise AssertionError(f"{proc.args[0]} exited {proc.returncode}\n{self.log()}")
        # The hub answers its API while it still starts up (services, proxy routes); it says
        # when it is done.
        if "JupyterHub is now running" not in self.log(tail=None):
            return False
        try:
            return httpx.get(f"{self.url}hub/api/", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        for proc in reversed(self.procs):  # the hub first: it may still talk to the proxy
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()

    def log(self, name: str = "hub", tail: int | None = 6000) -> str:
        path = self.tmp / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return text[-tail:] if tail else text

    def log_seconds(self, first: str, then: str) -> float:
        """Seconds between the hub's log lines containing ``first`` and ``then``."""
        stamps = {}
        for line in self.log(tail=None).splitlines():
            for text in (first, then):
                if text in line and text not in stamps:
                    stamps[text] = datetime.strptime(" ".join(line.split()[1:3]),
                                                     "%Y-%m-%d %H:%M:%S.%f")
        assert len(stamps) == 2, f"hub log lacks {first!r} or {then!r}:\n{self.log()}"
        return (stamps[then] - stamps[first]).total_seconds()

    def wait(self, condition: Any, timeout: float, what: str) -> Any:
        """:func:`wait_for`, failing with the hub's log (and the pods' logs) attached."""
        try:
            return wait_for(condition, timeout, what)
        except AssertionError as exc:
            pods = {p["metadata"]["name"]: self.kube.pod_log(p["metadata"]["name"])[-3000:]
                    for p in self.kube.objects("pods")}
            raise AssertionError(f"{exc}\n--- hub log ---\n{self.log()}\n--- pods ---\n"
                                 f"{pods}") from None

    def api(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.request(method, f"{self.url}hub/api/{path}", headers=self.auth,
                             timeout=60, **kwargs)

    def server(self, user: str) -> dict[str, Any] | None:
        r = self.api("GET", f"users/{user}")
        r.raise_for_status()
        return r.json()["servers"].get("")

    def progress(self, user: str) -> list[dict[str, Any]]:
        """The spawn page's progress events for ``user``'s server, until ready or failed."""
        events = []
        with httpx.stream("GET", f"{self.url}hub/api/users/{user}/server/progress",
                          headers=self.auth, timeout=90) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if line.startswith("data:"):
                    events.append(json.loads(line[5:]))
                    if events[-1].get("ready") or events[-1].get("failed"):
                        break
        return events


def operator_db_secret(tmp: Path) -> dict[str, Any]:
    """The operator's database Secret (``db.existingSecret``); the tuner's Deployment, which
    reads ``url``, does not run here, and the hub keeps its own SQLite (``db.hubUrlKey`` "")."""
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "tunehub-db"},
            "stringData": {"url": f"sqlite:///{tmp / 'tuner.sqlite'}"}}


@pytest.fixture
def chart_values() -> dict[str, Any]:
    """The values of the install: the example GPU lab (a test class may override this)."""
    return example_values()


@pytest.fixture
def chart_hub(kube: KubeCluster, tmp_path: Path,
              chart_values: dict[str, Any]) -> Iterator[ChartHub]:
    """The chart (``chart_values``, the example GPU lab by default), installed on the emulated
    cluster as far as the hub goes (PriorityClasses, generated Secrets, hub values, hub
    environment, proxy); started hub and proxy."""
    hub_port, proxy_port, proxy_api_port, notebook_port = (free_port() for _ in range(4))
    values = chart_values
    values["data"]["mountPath"] = str(kube.data_dir)  # the harness exposes claims in place
    values["db"] = {"existingSecret": "tunehub-db", "urlKey": "url", "hubUrlKey": ""}
    values["hub"]["port"] = hub_port
    # Eight T4s are more than the inventory says any node has: refused before a pod exists.
    values["notebooks"]["profiles"].append({
        "slug": "t4-8", "displayName": "8 × T4", "description": "more than a T4 node holds",
        "gpus": 8, "gpuType": "t4", "groups": ["platform"]})
    objects = [*render(values, namespace=kube.namespace), operator_db_secret(tmp_path)]
    for obj in objects:
        if obj["kind"] in ("PriorityClass", "Secret"):
            kube.create(obj)
    # The hub runs as the chart's ServiceAccount, under its Role, in a namespace enforcing the
    # Pod Security level the chart documents.
    install_chart_security(kube)
    for sub in ("datasets", "models"):
        (kube.data_dir / sub).mkdir(parents=True, exist_ok=True)
    (kube.data_dir / "datasets" / "digits.csv").write_text("0,1\n")

    # The hub pod: its values Secret mounted as a file, its environment as the chart sets it.
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(hub_values(objects)))
    (tmp_path / "hub_config.py").write_text(HUB_OVERRIDES)
    deployment = find(objects, "Deployment", f"{RELEASE}-hub")
    chart_env = resolve_env(deployment["spec"]["template"]["spec"]["containers"][0], objects,
                            kube.namespace)
    assert chart_env["TUNEHUB_MODE"] == "kubernetes"
    assert chart_env["TUNEHUB_TUNER_API_TOKEN"]  # from the rendered tuner-token Secret
    chart_env.update({  # the Deployment's mount paths, here
        "TUNEHUB_HUB_VALUES": str(tmp_path / "values.yaml"),
        "TUNEHUB_HUB_STATE": str(tmp_path / "state"),
        "HOME": str(tmp_path / "home"),
    })
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("TUNEHUB_", "JUPYTERHUB_", "CONFIGPROXY_", "KUBERNETES_"))}
    env = {**base, **chart_env,
           "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
           # The hub pod's service account token, here: a kubeconfig for the emulator.
           "KUBECONFIG": str(hub_kubeconfig(kube)),
           "T_REPO_CONFIG": str(REPO / "jupyterhub_config.py"),
           "T_HUB_CONNECT_URL": f"http://127.0.0.1:{hub_port}",
           "T_PROXY_API_URL": f"http://127.0.0.1:{proxy_api_port}",
           "T_NOTEBOOK_PORT": str(notebook_port),
           "T_DRIVER_TOKEN": DRIVER_TOKEN}
    hub = ChartHub(f"http://127.0.0.1:{proxy_port}/", kube, tmp_path, env,
                   local_proxy_command(objects, proxy_port, proxy_api_port, hub_port))
    try:
        yield hub.start()
    finally:
        hub.stop()


@pytest.mark.timeout(240)
def test_cpu_notebook_pod_starts_and_answers_through_the_proxy(
        chart_hub: ChartHub, kube: KubeCluster) -> None:
    hub = chart_hub
    began = time.monotonic()
    # The tuner's Deployment is not running: the hub came up regardless, without waiting
    # JupyterHub's default 30 s for it.
    assert hub.log_seconds("Adding external service tuner at http://tunehub-tuner:8082",
                           "Cannot connect to external service tuner at "
                           "http://tunehub-tuner:8082") < 10

    assert hub.api("POST", "users/alice").status_code == 201
    r = hub.api("POST", "users/alice/server", json={"profile": "cpu"})
    assert r.status_code in (201, 202), r.text
    hub.wait(lambda: (hub.server("alice") or {}).get("ready"), 120, "alice's server to be ready")
    assert time.monotonic() - began < 60

    pod = kube.get("pods", "jupyter-alice")
    assert pod is not None and pod["status"]["phase"] == "Running"
    nb = pod["spec"]["containers"][0]
    # The server runs jupyterhub-singleuser with tunehub's arguments (with the image's CMD
    # KubeSpawner would drop them) under the image's entrypoint, with the profile's environment
    # added to, not replacing, the hub's.
    assert "command" not in nb
    assert nb["args"][0] == "jupyterhub-singleuser"
    assert "--ServerApp.jpserver_extensions={'hub.singleuser.busy_activity': True}" in nb["args"]
    env = {e["name"]: e.get("value") for e in nb["env"]}
    assert env["TUNEHUB_API_URL"] == "http://tunehub-tuner:8082/services/tuner/"
    assert env["TUNEHUB_DATA"] == str(kube.data_dir)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "none"
    assert nb["resources"]["limits"]["memory"] and "nvidia.com/gpu" not in nb["resources"]["limits"]
    # The hub made the user's writable area before the spawn.
    assert (kube.data_dir / "users" / "alice").is_dir()

    # Through the proxy, from the pod's process.
    status = httpx.get(f"{hub.url}user/alice/api/status", headers=hub.auth, timeout=30)
    assert status.status_code == 200, status.text
    assert "kernels" in status.json()
    listing = httpx.get(f"{hub.url}user/alice/api/contents/datasets", headers=hub.auth,
                        timeout=30)
    assert listing.status_code == 200, listing.text
    assert [f["name"] for f in listing.json()["content"]] == ["digits.csv"]
    assert "tunehub: busy kernels count as activity" in kube.pod_log("jupyter-alice")
    # JupyterLab neither asks about nor fetches jupyter.org news (chart default).
    lab = httpx.get(f"{hub.url}user/alice/lab", headers=hub.auth, timeout=30)
    assert lab.status_code == 200, lab.text[:500]
    page_config = json.loads(lab.text.split('id="jupyter-config-data" type="application/json">',
                                            1)[1].split("</script>", 1)[0])
    assert page_config["news"] == {"disabled": True}
    assert "jupyter-alice" in kube.pids()

    r = hub.api("DELETE", "users/alice/server")
    assert r.status_code in (202, 204), r.text
    hub.wait(lambda: hub.server("alice") is None and kube.get("pods", "jupyter-alice") is None
             and not kube.pids(), 60, "alice's server, pod and process to be gone")

    # Least privilege: a spawn and a stop used every verb the chart's hub Role grants, and
    # were refused nothing.
    used, granted = kube.exercised(HUB_ACCOUNT), kube.granted(HUB_ACCOUNT)
    assert used == granted, (f"granted but never used: {sorted(granted - used)}; "
                             f"used but not granted: {sorted(used - granted)}")
    assert kube.exercised(HUB_ACCOUNT, allowed=False) == set()


@pytest.mark.timeout(240)
def test_gpu_spawn_no_node_can_hold_fails_fast_with_the_reason(
        chart_hub: ChartHub, kube: KubeCluster) -> None:
    hub = chart_hub
    assert hub.api("POST", "users/pat").status_code == 201
    assert hub.api("POST", "groups/platform", json={"users": ["pat"]}).status_code == 201

    # More GPUs than the chart's inventory says a node of the type has: refused before a pod
    # exists, as a refusal (400 with the reason), not a hub error (500).
    began = time.monotonic()
    r = hub.api("POST", "users/pat/server", json={"profile": "t4-8"})
    assert r.status_code == 400, r.text
    reason = "cannot start '8 × T4': no node has 8 × Tesla-T4 GPUs; the largest has 4"
    assert r.json()["message"] == reason
    assert hub.progress("pat")[-1] == {"progress": 100, "failed": True,
                                       "message": f"Spawn failed: {reason}"}
    assert kube.objects("pods") == []
    assert time.monotonic() - began < 15

    # The inventory promises 8-GPU A100 nodes but the cluster's only A100 node has 2: the pod is
    # created, the scheduler refuses it, and the spawn fails with the scheduler's words after
    # unschedulable_timeout instead of waiting out start_timeout (300 s).
    began = time.monotonic()
    r = hub.api("POST", "users/pat/server", json={"profile": "a100-8"})
    if r.status_code == 202:  # still pending after the hub's slow_spawn_timeout (10 s)
        reason = hub.progress("pat")[-1]["message"].removeprefix("Spawn failed: ")
    else:
        assert r.status_code == 400, r.text
        reason = r.json()["message"]
        assert hub.progress("pat")[-1]["message"] == f"Spawn failed: {reason}"
    assert reason.startswith("no node can take this server (0/3 nodes are available: "
                             "1 Insufficient nvidia.com/gpu"), reason
    assert reason.endswith("gave up after 3 s. Choose a smaller profile or try later.")
    assert time.monotonic() - began < 30
    assert hub.server("pat") is None
    # The refused pod does not stay queued (its priority would let it preempt others later).
    hub.wait(lambda: kube.objects("pods") == [], 30, "the refused pod to be removed")
    # A refusal is logged as one line, not as the hub's unhandled-error traceback.
    assert "Unhandled error starting pat's server" not in hub.log(tail=None), hub.log()



@pytest.mark.timeout(180)
def test_fresh_install_admin_from_the_secret_logs_in(chart_hub: ChartHub,
                                                     kube: KubeCluster) -> None:
    """`helm install` and nothing else: the first admin's password is the generated Secret's
    (what NOTES.txt tells the operator to read), and it logs in through the proxy."""
    hub = chart_hub
    secret = kube.get("secrets", f"{RELEASE}-hub-admin")
    password = base64.b64decode(secret["data"]["password"]).decode()
    assert hub.env["TUNEHUB_ADMIN_PASSWORD"] == password  # the Deployment's secretKeyRef
    token = login_token(hub.url, "admin", password)
    me = httpx.get(f"{hub.url}hub/api/user", headers={"Authorization": f"token {token}"},
                   timeout=30)
    assert me.status_code == 200 and me.json()["name"] == "admin" and me.json()["admin"] is True
    with httpx.Client(base_url=hub.url, timeout=30) as client:
        page = client.get("hub/login")
        xsrf = page.text.split('name="_xsrf" value="', 1)[1].split('"', 1)[0]
        client.post("hub/login", data={"username": "admin", "password": password + "x",
                                       "_xsrf": xsrf})
        assert "jupyterhub-session-id" not in client.cookies


class TestOidcInstall:
    """An install whose values log people in through an OpenID Connect provider (hub.config,
    GenericOAuthenticator): the whole login, hub to provider and back, over real HTTP."""

    @pytest.fixture
    def idp(self) -> Iterator[OidcProvider]:
        provider = OidcProvider("tunehub", secrets.token_urlsafe(16)).start()
        yield provider
        provider.stop()

    @pytest.fixture
    def chart_values(self, idp: OidcProvider) -> dict[str, Any]:
        values = example_values()
        settings = idp.settings(callback_url="")
        del settings["oauth_callback_url"]  # derived from the public URL of the request
        values["hub"]["config"] = {
            "JupyterHub": {"authenticator_class": "generic-oauth"},
            "GenericOAuthenticator": {**settings, "allowed_groups": ["lab"],
                                      "admin_groups": ["lab-admins"], "manage_groups": True}}
        return values

    @pytest.mark.timeout(180)
    def test_people_log_in_through_the_identity_provider(
            self, chart_hub: ChartHub, kube: KubeCluster, idp: OidcProvider) -> None:
        from urllib.parse import parse_qs, urlparse

        hub = chart_hub
        # No local admin account or admin Secret when another authenticator logs people in.
        assert kube.get("secrets", f"{RELEASE}-hub-admin") is None
        assert "TUNEHUB_ADMIN_PASSWORD" not in hub.env

        def login(user: dict[str, Any]) -> httpx.Response:
            idp.user = user
            with httpx.Client(base_url=hub.url, timeout=30) as browser:
                r = browser.get("hub/oauth_login")
                assert r.status_code == 302, r.text[:500]
                target = urlparse(r.headers["location"])
                assert f"{target.scheme}://{target.netloc}{target.path}" == f"{idp.url}/auth"
                query = parse_qs(target.query)
                assert query["client_id"] == ["tunehub"]
                assert query["redirect_uri"] == [f"{hub.url}hub/oauth_callback"]
                back = httpx.get(r.headers["location"], timeout=30)  # the provider
                assert back.status_code == 302, back.text
                return browser.get(back.headers["location"])  # the hub's callback

        r = login({"email": "ada@example.com", "groups": ["lab", "lab-admins"]})
        assert r.status_code == 302 and "jupyterhub-session-id" in r.cookies, r.text[:500]
        ada = hub.api("GET", "users/ada@example.com").json()
        assert ada["admin"] is True  # admin_groups from the values
        assert {"lab", "lab-admins"} <= set(ada["groups"])  # manage_groups: the IdP's groups
        # Not in allowed_groups: refused, and no hub user is made.
        r = login({"email": "eve@example.com", "groups": ["contractors"]})
        assert r.status_code == 403 and "jupyterhub-session-id" not in r.cookies
        assert hub.api("GET", "users/eve@example.com").status_code == 404
        assert not (hub.tmp / "state" / "accounts.json").exists()
