"""A whole emulated cluster: API server emulator + scheduler/kubelet + Job controller on one
background event loop, a namespace with its default ServiceAccount, the data claim mapped to a
local directory, and a kubeconfig file pointing at it."""

from __future__ import annotations

import tempfile
from pathlib import Path

import yaml

from .client import ApiFailure, HarnessClient
from .emulator import Emulator
from .faults import Faults
from .jobs import JobController
from .kubelet import Kubelet
from .kueue import KueueController
from .nodes import FakeNode
from .objects import JSON
from .rbac import ADMIN_TOKEN, grant, service_account_user
from .resources import RBAC, RESOURCES
from .runner import Runtime
from .store import Counters

DATA_CLAIM = "tunehub-data"


def default_nodes() -> list[FakeNode]:
    """Two GPU types and a CPU-only node, as a small heterogeneous GPU pool."""
    return [
        FakeNode("gpu-a100-0", cpu="32", memory="256Gi", gpus=2,
                 gpu_product="NVIDIA-A100-SXM4-80GB"),
        FakeNode("gpu-t4-0", cpu="16", memory="64Gi", gpus=4, gpu_product="Tesla-T4"),
        FakeNode("cpu-0", cpu="8", memory="32Gi"),
    ]


class KubeCluster:
    """See the package docstring for the public API (it is what the ``kube`` fixture yields)."""

    def __init__(self, workdir: Path | None = None, nodes: list[FakeNode] | None = None,
                 namespace: str = "tunehub", data_dir: Path | None = None,
                 pod_security: str | None = None) -> None:
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="kube-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.nodes = default_nodes() if nodes is None else nodes
        self.namespace = namespace
        #: the namespace's ``pod-security.kubernetes.io/enforce`` level (None: unlabelled,
        #: i.e. privileged, as a fresh namespace of a real cluster)
        self.pod_security = pod_security
        self.claims: dict[str, Path] = {}
        self.data_dir = Path(data_dir) if data_dir else self.workdir / "data"
        self.map_claim(DATA_CLAIM, self.data_dir)
        self.emulator = Emulator(self.workdir / "logs")
        #: container runtime knobs: ``missing_images`` (set), ``enforce_memory_limits``,
        #: ``run_as_users`` (bool), ``gpu_driver_env`` (dict: what GPU containers also get)
        self.runtime = Runtime(self.claims, self.emulator.log_dir, 0)
        self.kubelet: Kubelet | None = None
        self.jobs: JobController | None = None
        self.kueue: KueueController | None = None
        self.url = ""
        self.kubeconfig = self.workdir / "kubeconfig.yaml"

    @property
    def counters(self) -> Counters:
        return self.emulator.counters

    @property
    def faults(self) -> Faults:
        """Faults to inject into the client's requests (:mod:`kubesim.faults`)."""
        return self.emulator.faults

    def map_claim(self, claim: str, path: Path | str) -> Path:
        """Make PersistentVolumeClaim ``claim`` visible to pods at local directory ``path``
        (pods must mount it at exactly that path)."""
        local = Path(path).resolve()
        local.mkdir(parents=True, exist_ok=True)
        self.claims[claim] = local
        if claim == DATA_CLAIM:
            self.data_dir = local
        return local

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> KubeCluster:
        self.url = self.emulator.start()
        self.emulator.call(self._start(), timeout=60)
        self._write_kubeconfig(self.kubeconfig, "harness", ADMIN_TOKEN)
        return self

    def _write_kubeconfig(self, path: Path, user: str, token: str) -> Path:
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "emulator", "context": {
                "cluster": "emulator", "user": user, "namespace": self.namespace}}],
            "current-context": "emulator"}))
        return path

    async def _start(self) -> None:
        client = HarnessClient(self.url, "setup")
        labels = ({"pod-security.kubernetes.io/enforce": self.pod_security}
                  if self.pod_security else {})
        try:
            await client.create("/api/v1/namespaces", {
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": self.namespace, "labels": labels}})
            await client.create(f"/api/v1/namespaces/{self.namespace}/persistentvolumeclaims", {
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": DATA_CLAIM, "namespace": self.namespace},
                "spec": {"accessModes": ["ReadWriteMany"],
                         "resources": {"requests": {"storage": "10Gi"}}}})
        except ApiFailure as exc:
            if exc.status != 409:
                raise
        finally:
            await client.close()
        self.runtime.api_port = int(self.url.rsplit(":", 1)[1])
        self.kubelet = Kubelet(self.url, self.nodes, self.runtime)
        self.jobs = JobController(self.url)
        self.kueue = KueueController(self.url)
        await self.kubelet.start()
        await self.jobs.start()
        await self.kueue.start()

    def stop(self) -> None:
        async def _stop() -> None:
            if self.kueue:
                await self.kueue.stop()
            if self.jobs:
                await self.jobs.stop()
            if self.kubelet:
                await self.kubelet.stop()

        try:
            if self.emulator.loop is not None:
                self.emulator.call(_stop(), timeout=30)
        finally:
            self.emulator.stop()

    def __enter__(self) -> KubeCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- helpers for tests ---------------------------------------------------------------------
    def create(self, obj: JSON) -> JSON:
        """Create ``obj`` through the API as the harness (not counted as a ``client``
        request): for seeding PriorityClasses, Kueue queues, Secrets... ``obj`` needs
        apiVersion and kind; namespaced objects default to the cluster's namespace."""
        from .admission import kind_resource

        res = kind_resource(obj.get("apiVersion", ""), obj.get("kind", ""))
        if res is None:
            raise KeyError(f"unknown kind {obj.get('apiVersion')} {obj.get('kind')}")
        base = f"/apis/{res.group}/{res.version}" if res.group else "/api/v1"
        if res.namespaced:
            ns = obj.get("metadata", {}).get("namespace") or self.namespace
            base += f"/namespaces/{ns}"

        async def _create() -> JSON:
            client = HarnessClient(self.url, "test")
            try:
                return await client.create(f"{base}/{res.plural}", obj)
            finally:
                await client.close()

        return self.emulator.call(_create())

    def apply(self, objects: list[JSON]) -> None:
        """:meth:`create` each object (e.g. a chart's ServiceAccounts, Roles, RoleBindings)."""
        for obj in objects:
            self.create(obj)

    def grant_anonymous(self, rules: list[JSON]) -> None:
        """Let unauthenticated requests read discovery and do ``rules`` (a ClusterRole bound
        to ``system:anonymous``): for clients that send no credentials over plain HTTP, such
        as Helm's Go client through helm-python-sdk."""
        discovery = {"nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*"], "verbs": ["get"]}
        self.apply(grant("anonymous", [discovery, *rules],
                         [{"kind": "User", "name": "system:anonymous", "apiGroup": RBAC}],
                         cluster=True))

    def label_namespace(self, labels: dict[str, str], namespace: str | None = None) -> JSON:
        """Merge ``labels`` into a namespace, e.g. ``pod-security.kubernetes.io/enforce``."""
        name = namespace or self.namespace

        async def _patch() -> JSON:
            client = HarnessClient(self.url, "test")
            try:
                return await client.request("PATCH", f"/api/v1/namespaces/{name}",
                                            {"metadata": {"labels": labels}},
                                            "application/merge-patch+json")
            finally:
                await client.close()

        return self.emulator.call(_patch())

    def service_account_kubeconfig(self, name: str, namespace: str | None = None) -> Path:
        """A kubeconfig authenticating as ServiceAccount ``name`` (which must exist when the
        token is used): what a pod of that account gets, for code run outside a pod."""
        ns = namespace or self.namespace
        token = self.emulator.rbac.issue_token(ns, name)
        return self._write_kubeconfig(self.workdir / f"kubeconfig-{ns}-{name}.yaml", name,
                                      token)

    def exercised(self, service_account: str, namespace: str | None = None,
                  allowed: bool | None = True) -> set[tuple[str, str, str]]:
        """``{(api group, resource, verb)}`` the ServiceAccount's requests were allowed
        (``allowed=False``: denied, None: both)."""
        user = service_account_user(namespace or self.namespace, service_account)
        return self.emulator.rbac.exercised(user.name, allowed)

    def granted(self, service_account: str, namespace: str | None = None
                ) -> set[tuple[str, str, str]]:
        """``{(api group, resource, verb)}`` the RBAC objects grant the ServiceAccount in
        its namespace."""
        ns = namespace or self.namespace
        user = service_account_user(ns, service_account)

        async def _granted() -> set[tuple[str, str, str]]:
            return self.emulator.rbac.granted(user, ns)

        return self.emulator.call(_granted())

    def objects(self, plural: str, namespace: str | None = "", group: str = "",
                version: str = "v1", label_selector: str | None = None) -> list[JSON]:
        """Stored objects of one resource (a snapshot, read directly from the store).
        ``namespace=""`` means the cluster's namespace, ``None`` all namespaces; cluster-scoped
        resources (nodes, priorityclasses...) ignore it."""
        found = [r for r in RESOURCES if r.plural == plural and (not group or r.group == group)]
        if not group and len(found) == 1:  # unique plurals find their own group/version
            group, version = found[0].group, found[0].version
        ns = self.namespace if namespace == "" else namespace
        if found and not found[0].namespaced:
            ns = None
        return self.emulator.objects(plural, ns, group, version, label_selector)

    def get(self, plural: str, name: str, namespace: str | None = "", group: str = "",
            version: str = "v1") -> JSON | None:
        found = [o for o in self.objects(plural, namespace, group, version)
                 if o["metadata"]["name"] == name]
        return found[0] if found else None

    def pod_log(self, pod: str, container: str | None = None, namespace: str | None = None
                ) -> str:
        """What ``pods/log`` would return: the container's captured stdout and stderr."""
        ns = namespace or self.namespace
        if container is None:
            found = self.get("pods", pod, ns)
            container = found["spec"]["containers"][0]["name"] if found else ""
        path = self.emulator.log_dir / ns / pod / f"{container}.log"
        return path.read_text() if path.exists() else ""

    def pids(self) -> dict[str, dict[str, int]]:
        """Live local processes per pod: ``{pod: {container: pid}}``."""
        assert self.kubelet is not None

        async def _pids() -> dict[str, dict[str, int]]:
            assert self.kubelet is not None
            return self.kubelet.process_ids()

        return self.emulator.call(_pids())

    def compact(self) -> None:
        """Forget the watch history: watches from older resourceVersions then get 410 Gone."""
        self.emulator.compact()
