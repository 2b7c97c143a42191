"""The table of API resources the emulator serves, and the discovery documents built from it.

One table drives routing, discovery (``/api``, ``/apis``, ``/apis/<group>/<version>``) and
schema lookup, so adding a resource is one line here."""

from __future__ import annotations

from dataclasses import dataclass, field

from .objects import JSON


@dataclass(frozen=True)
class Resource:
    """One REST resource: where it lives and how it behaves."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    has_status: bool = False
    short_names: tuple[str, ...] = field(default=())

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """``Kind.group`` as the real API server names objects in error messages."""
        return f"{self.kind}.{self.group}" if self.group else self.kind

    @property
    def singular(self) -> str:
        return self.kind.lower()


KUEUE = "kueue.x-k8s.io"
RBAC = "rbac.authorization.k8s.io"

RESOURCES: tuple[Resource, ...] = (
    Resource("", "v1", "namespaces", "Namespace", namespaced=False, has_status=True),
    Resource("", "v1", "nodes", "Node", namespaced=False, has_status=True),
    Resource("", "v1", "pods", "Pod", has_status=True, short_names=("po",)),
    Resource("", "v1", "services", "Service", has_status=True, short_names=("svc",)),
    Resource("", "v1", "endpoints", "Endpoints"),
    Resource("", "v1", "secrets", "Secret"),
    Resource("", "v1", "configmaps", "ConfigMap", short_names=("cm",)),
    Resource("", "v1", "events", "Event", short_names=("ev",)),
    Resource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", has_status=True),
    Resource("", "v1", "serviceaccounts", "ServiceAccount", short_names=("sa",)),
    Resource("", "v1", "resourcequotas", "ResourceQuota", has_status=True,
             short_names=("quota",)),
    Resource("", "v1", "limitranges", "LimitRange", short_names=("limits",)),
    Resource("batch", "v1", "jobs", "Job", has_status=True),
    Resource("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", namespaced=False),
    Resource("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy"),
    Resource(RBAC, "v1", "roles", "Role"),
    Resource(RBAC, "v1", "rolebindings", "RoleBinding"),
    Resource(RBAC, "v1", "clusterroles", "ClusterRole", namespaced=False),
    Resource(RBAC, "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False),
    Resource(KUEUE, "v1beta2", "localqueues", "LocalQueue", has_status=True),
    Resource(KUEUE, "v1beta2", "clusterqueues", "ClusterQueue", namespaced=False,
             has_status=True),
    Resource(KUEUE, "v1beta2", "resourceflavors", "ResourceFlavor", namespaced=False),
    Resource(KUEUE, "v1beta2", "workloads", "Workload", has_status=True),
    Resource(KUEUE, "v1beta2", "workloadpriorityclasses", "WorkloadPriorityClass",
             namespaced=False),
)

BY_PATH: dict[tuple[str, str, str], Resource] = {
    (r.group, r.version, r.plural): r for r in RESOURCES
}
BY_KIND: dict[tuple[str, str], Resource] = {(r.api_version, r.kind): r for r in RESOURCES}


def lookup(group: str, version: str, plural: str) -> Resource | None:
    return BY_PATH.get((group, version, plural))


def group_versions() -> dict[str, list[str]]:
    """Non-core groups and their versions, in table order."""
    out: dict[str, list[str]] = {}
    for r in RESOURCES:
        if r.group and r.version not in out.setdefault(r.group, []):
            out[r.group].append(r.version)
    return out


def resource_list(group: str, version: str) -> JSON | None:
    """The ``APIResourceList`` for one group/version, or None if it is not served."""
    entries = []
    for r in RESOURCES:
        if (r.group, r.version) != (group, version):
            continue
        verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update",
                 "watch"]
        entries.append({"name": r.plural, "singularName": r.singular, "namespaced": r.namespaced,
                        "kind": r.kind, "verbs": verbs, "shortNames": list(r.short_names)})
        if r.has_status:
            entries.append({"name": f"{r.plural}/status", "singularName": "",
                            "namespaced": r.namespaced, "kind": r.kind,
                            "verbs": ["get", "patch", "update"]})
        if r.plural == "pods":
            entries.append({"name": "pods/log", "singularName": "", "namespaced": True,
                            "kind": "Pod", "verbs": ["get"]})
            entries.append({"name": "pods/binding", "singularName": "", "namespaced": True,
                            "kind": "Binding", "verbs": ["create"]})
    if not entries:
        return None
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
            "resources": entries}


def api_group(group: str) -> JSON:
    versions = [{"groupVersion": f"{group}/{v}", "version": v}
                for v in group_versions().get(group, [])]
    return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": versions,
            "preferredVersion": versions[0] if versions else {}}


def api_group_list() -> JSON:
    return {"kind": "APIGroupList", "apiVersion": "v1",
            "groups": [api_group(g) for g in group_versions()]}
