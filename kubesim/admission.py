"""What a real API server does to an object besides storing it: server-set metadata,
defaulting, admission checks (namespace exists, service account, PriorityClass resolution,
LimitRange, Pod Security, ResourceQuota, in the real plugins' order) and the garbage
collector's handling of ownerReferences on delete."""

from __future__ import annotations

import base64
import copy
import datetime as dt
import random
import uuid

from . import podsecurity
from .objects import JSON
from .quota import Quotas
from .resources import BY_KIND, RESOURCES, Resource, lookup
from .store import Store

#: The scheduling gate Kueue's pod integration puts on a queued pod until it is admitted.
KUEUE_GATE = {"name": "kueue.x-k8s.io/admission"}
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"

#: Priority classes every cluster has.
BUILTIN_PRIORITY_CLASSES = {"system-cluster-critical": 2000000000,
                            "system-node-critical": 2000001000}


class Refused(Exception):
    """An admission refusal: HTTP ``code`` with a Kubernetes ``reason`` and message."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def generate_name(prefix: str) -> str:
    return prefix + "".join(random.choice(_GENERATE_ALPHABET) for _ in range(5))


def _default_container(c: JSON) -> None:
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    image = c.get("image", "")
    latest = ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest")
    c.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
    res = c.setdefault("resources", {})
    if res.get("limits"):
        requests = res.setdefault("requests", {})
        for name, q in res["limits"].items():
            requests.setdefault(name, q)  # limits without requests: requests default to limits
    for p in c.get("ports") or []:
        p.setdefault("protocol", "TCP")


def default_pod_spec(spec: JSON) -> None:
    """The defaults the API server fills into every pod spec (also Job templates)."""
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        _default_container(c)


def _qos(spec: JSON) -> str:
    containers = spec.get("containers") or []
    if all((c.get("resources") or {}).get("limits", {}).get(r) is not None
           and c["resources"]["limits"][r] == c["resources"].get("requests", {}).get(r)
           for c in containers for r in ("cpu", "memory")):
        return "Guaranteed"
    if any((c.get("resources") or {}).get(k) for c in containers for k in ("requests", "limits")):
        return "Burstable"
    return "BestEffort"


class Admission:
    """Defaulting and admission for create/update, and garbage collection for delete."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.quotas = Quotas(store)
        #: ``Warning`` headers of the last create (Pod Security of a Job's pod template)
        self.warnings: list[str] = []
        self._ips = 0
        self._waiting: dict[str, tuple[Resource, str, str]] = {}  # foreground deletions

    def _resource(self, plural: str, group: str = "", version: str = "v1") -> Resource:
        res = lookup(group, version, plural)
        assert res is not None
        return res

    def on_create(self, res: Resource, obj: JSON, namespace: str | None) -> None:
        """Fill server-set metadata and kind defaults, run admission checks (may raise)."""
        self.warnings = []
        meta = obj.setdefault("metadata", {})
        if res.namespaced:
            if meta.get("namespace") not in (None, namespace):
                raise Refused(400, "BadRequest", "the namespace of the provided object does "
                                                 "not match the namespace sent on the request")
            meta["namespace"] = namespace
            if self.store.get(self._resource("namespaces"), "", namespace or "") is None:
                raise Refused(404, "NotFound", f'namespaces "{namespace}" not found')
        else:
            meta.pop("namespace", None)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = generate_name(meta["generateName"])
        if not meta.get("name"):
            raise Refused(422, "Invalid", "metadata.name: Required value: name or generateName "
                                          "is required")
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now()
        meta["generation"] = 1
        for k in ("resourceVersion", "deletionTimestamp", "selfLink"):
            meta.pop(k, None)
        hook = getattr(self, f"_create_{res.plural}", None)
        if hook:
            hook(obj)

    def _queued_in_kueue(self, obj: JSON) -> bool:
        """Labelled for a Kueue LocalQueue while Kueue runs (some ClusterQueue exists)."""
        kueue = lookup("kueue.x-k8s.io", "v1beta2", "clusterqueues")
        return bool((obj["metadata"].get("labels") or {}).get("kueue.x-k8s.io/queue-name")
                    and kueue is not None and self.store.list(kueue, None))

    def _create_pods(self, pod: JSON) -> None:
        spec = pod.setdefault("spec", {})
        name = pod["metadata"]["name"]
        default_pod_spec(spec)
        if self._queued_in_kueue(pod) and not pod["metadata"].get("ownerReferences"):
            # Kueue's pod integration (its webhook): a queued plain pod (a notebook) is
            # gated until Kueue admits it from its ClusterQueue's quota.
            gates = spec.setdefault("schedulingGates", [])
            if KUEUE_GATE not in gates:
                gates.append(KUEUE_GATE)
            pod["metadata"].setdefault("labels", {})["kueue.x-k8s.io/managed"] = "true"
        sa = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
        spec["serviceAccountName"] = spec["serviceAccount"] = sa
        ns = pod["metadata"]["namespace"]
        if self.store.get(self._resource("serviceaccounts"), ns, sa) is None:
            raise Refused(403, "Forbidden", f'pods "{name}" is forbidden: error looking up '
                                            f'service account {ns}/{sa}: serviceaccount '
                                            f'"{sa}" not found')
        pcs = self._resource("priorityclasses", "scheduling.k8s.io")
        pc_name = spec.get("priorityClassName")
        if pc_name:
            pc = self.store.get(pcs, "", pc_name)
            value = BUILTIN_PRIORITY_CLASSES.get(pc_name) if pc is None else pc.get("value")
            if value is None:
                raise Refused(403, "Forbidden", f'pods "{name}" is forbidden: no PriorityClass '
                                                f'with name {pc_name} was found')
            spec["priority"] = value
            if pc is not None and pc.get("preemptionPolicy"):
                spec.setdefault("preemptionPolicy", pc["preemptionPolicy"])
        else:
            default = [p for p in self.store.list(pcs, None) if p.get("globalDefault")]
            spec["priority"] = default[0]["value"] if default else 0
            if default:
                spec["priorityClassName"] = default[0]["metadata"]["name"]
        spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
        limits = self.quotas.limit_range(pod)
        if limits:
            text = limits[0] if len(limits) == 1 else f"[{', '.join(limits)}]"
            raise Refused(403, "Forbidden", f'pods "{name}" is forbidden: {text}')
        level, version = podsecurity.policy(self._namespace(ns))
        found = podsecurity.violations(level, spec)
        if found:
            raise Refused(403, "Forbidden", podsecurity.refusal(name, level, version, found))
        refused = self.quotas.admit("Pod", pod)
        if refused:
            raise Refused(403, "Forbidden", f'pods "{name}" is forbidden: {refused}')
        pod["status"] = {"phase": "Pending", "qosClass": _qos(spec)}

    def _namespace(self, name: str) -> JSON | None:
        return self.store.get(self._resource("namespaces"), "", name)

    def _create_jobs(self, job: JSON) -> None:
        spec = job.setdefault("spec", {})
        uid, name = job["metadata"]["uid"], job["metadata"]["name"]
        if spec.get("parallelism") is None and spec.get("completions") is None:
            spec["completions"] = 1  # neither set: one pod; parallelism only: a work queue
        spec.setdefault("parallelism", 1)
        spec.setdefault("completionMode", "NonIndexed")
        spec.setdefault("backoffLimit", 6)
        spec.setdefault("suspend", False)
        if self._queued_in_kueue(job):
            spec["suspend"] = True  # Kueue's mutating webhook: queued Jobs start suspended
        spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
        spec.setdefault("manualSelector", False)
        template = spec.setdefault("template", {})
        labels = template.setdefault("metadata", {}).setdefault("labels", {})
        if not spec.get("manualSelector"):
            spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
            labels.update({"batch.kubernetes.io/controller-uid": uid, "controller-uid": uid,
                           "batch.kubernetes.io/job-name": name, "job-name": name})
        job_labels = job["metadata"].setdefault("labels", {})
        for k in ("batch.kubernetes.io/controller-uid", "controller-uid",
                  "batch.kubernetes.io/job-name", "job-name"):
            job_labels.setdefault(k, labels.get(k, name if "name" in k else uid))
        default_pod_spec(template.setdefault("spec", {}))
        # Pod Security only warns about a workload's template; its pods are refused later.
        level, version = podsecurity.policy(self._namespace(job["metadata"]["namespace"]))
        found = podsecurity.violations(level, template["spec"])
        if found:
            self.warnings.append(podsecurity.warning(level, version, found))
        refused = self.quotas.admit("Job", job)
        if refused:
            raise Refused(403, "Forbidden", f'jobs.batch "{name}" is forbidden: {refused}')
        job["status"] = {}

    def _create_services(self, svc: JSON) -> None:
        spec = svc.setdefault("spec", {})
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        if spec.get("clusterIP") != "None":
            self._ips += 1
            spec["clusterIP"] = f"10.96.{self._ips // 250}.{self._ips % 250 + 1}"
        spec["clusterIPs"] = [spec["clusterIP"]]
        for p in spec.get("ports") or []:
            p.setdefault("protocol", "TCP")
            p.setdefault("targetPort", p.get("port"))
        svc["status"] = {"loadBalancer": {}}

    def _create_secrets(self, secret: JSON) -> None:
        secret.setdefault("type", "Opaque")
        self.normalise(secret)

    def _create_namespaces(self, ns: JSON) -> None:
        ns.setdefault("spec", {"finalizers": ["kubernetes"]})
        ns["status"] = {"phase": "Active"}
        ns["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = \
            ns["metadata"]["name"]

    def _create_persistentvolumeclaims(self, pvc: JSON) -> None:
        spec = pvc.setdefault("spec", {})
        spec.setdefault("volumeMode", "Filesystem")
        storage = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
        pvc["status"] = {"phase": "Bound", "accessModes": spec.get("accessModes", []),
                         "capacity": {"storage": storage}}

    def after_create(self, res: Resource, obj: JSON) -> None:
        """Side effects of a create: a new namespace gets its ``default`` ServiceAccount;
        an object whose owners are all gone is garbage-collected at once."""
        if self.orphaned(obj):
            self.delete(res, obj, "Background")
            return
        if res.plural == "namespaces":
            name = obj["metadata"]["name"]
            sa = {"apiVersion": "v1", "kind": "ServiceAccount",
                  "metadata": {"name": "default", "namespace": name}}
            self.on_create(self._resource("serviceaccounts"), sa, name)
            self.store.put(self._resource("serviceaccounts"), sa)

    @staticmethod
    def normalise(obj: JSON) -> None:
        """Secrets: ``stringData`` is write-only and folded into base64 ``data``."""
        if obj.get("kind") == "Secret" and obj.get("stringData"):
            data = obj.setdefault("data", {})
            for k, v in obj.pop("stringData").items():
                data[k] = base64.b64encode(v.encode()).decode()

    @staticmethod
    def on_update(res: Resource, old: JSON, new: JSON, subresource: str | None) -> JSON:
        """Merge an update into the stored object: immutable metadata kept, status only
        through ``/status`` (and only status through it), generation bumped on spec change."""
        if subresource == "status":
            merged = copy.deepcopy(old)
            merged["status"] = new.get("status", {})
            return merged
        merged = copy.deepcopy(new)
        meta, old_meta = merged.setdefault("metadata", {}), old["metadata"]
        for k in ("uid", "creationTimestamp", "namespace", "name", "deletionTimestamp"):
            if k in old_meta:
                meta[k] = old_meta[k]
        meta["generation"] = old_meta.get("generation", 1)
        if res.has_status:
            if "status" in old:
                merged["status"] = old["status"]
            else:
                merged.pop("status", None)
        if merged.get("spec") != old.get("spec"):
            meta["generation"] += 1
        Admission.normalise(merged)
        return merged

    def dependents(self, owner_uid: str) -> list[tuple[Resource, JSON]]:
        out = []
        for res in RESOURCES:
            for obj in self.store.list(res, None):
                refs = obj["metadata"].get("ownerReferences") or []
                if any(r.get("uid") == owner_uid for r in refs):
                    out.append((res, obj))
        return out

    def terminate_pod(self, pod: JSON, grace: int | None) -> JSON:
        """Graceful pod deletion: a running pod only gets ``deletionTimestamp`` (it is
        Terminating) and its kubelet removes it once the processes are gone; a pod that never
        started, has finished, or is deleted with grace 0 goes at once."""
        meta = pod["metadata"]
        if grace is None:
            grace = int(meta.get("deletionGracePeriodSeconds")
                        or pod["spec"].get("terminationGracePeriodSeconds", 30))
        running = pod["spec"].get("nodeName") and pod["status"].get("phase") not in (
            "Succeeded", "Failed")
        if grace <= 0 or not running:
            return self.store.remove(self._resource("pods"), meta["namespace"],
                                     meta["name"]) or pod
        if meta.get("deletionTimestamp"):
            return pod
        pod = copy.deepcopy(pod)
        stamp = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=grace)
        pod["metadata"]["deletionTimestamp"] = stamp.strftime("%Y-%m-%dT%H:%M:%SZ")
        pod["metadata"]["deletionGracePeriodSeconds"] = grace
        return self.store.put(self._resource("pods"), pod)

    def delete(self, res: Resource, obj: JSON, propagation: str | None,
               grace: int | None = None) -> JSON:
        """Delete ``obj`` and handle its dependents as the garbage collector would.
        Without an explicit policy, Jobs orphan their pods (the batch/v1 legacy default),
        everything else cascades in the background. Pods terminate gracefully."""
        if propagation is None:
            propagation = "Orphan" if res.plural == "jobs" else "Background"
        uid = obj["metadata"]["uid"]
        if propagation == "Foreground" and self.dependents(uid):
            return self._foreground(res, obj)
        if res.plural == "pods":
            terminated = self.terminate_pod(obj, grace)
            if terminated["metadata"].get("deletionTimestamp") and self.store.get(
                    res, obj["metadata"]["namespace"], obj["metadata"]["name"]):
                return terminated  # Terminating: dependents wait for the final removal
            for dep_res, dep in self.dependents(uid):
                self.delete(dep_res, dep, propagation)
            return terminated
        gone: JSON | None = None
        if propagation != "Foreground":  # the owner goes first, dependents follow
            gone = self.store.remove(res, obj["metadata"].get("namespace", ""),
                                     obj["metadata"]["name"])
        for dep_res, dep in self.dependents(uid):
            if propagation == "Orphan":
                dep = copy.deepcopy(dep)
                refs = [r for r in dep["metadata"]["ownerReferences"] if r.get("uid") != uid]
                dep["metadata"]["ownerReferences"] = refs
                if not refs:
                    del dep["metadata"]["ownerReferences"]
                self.store.put(dep_res, dep)
            else:
                self.delete(dep_res, dep, "Background")
        if res.plural == "namespaces":
            for r in RESOURCES:
                if r.namespaced:
                    for o in self.store.list(r, obj["metadata"]["name"]):
                        self.store.remove(r, o["metadata"]["namespace"], o["metadata"]["name"])
        if gone is None:
            gone = self.store.remove(res, obj["metadata"].get("namespace", ""),
                                     obj["metadata"]["name"])
        return gone or obj

    def _foreground(self, res: Resource, obj: JSON) -> JSON:
        """Foreground deletion: the owner stays (deletionTimestamp + the foregroundDeletion
        finalizer) until every dependent is gone, then it is removed too."""
        owner = copy.deepcopy(obj)
        meta = owner["metadata"]
        if not meta.get("deletionTimestamp"):
            meta["deletionTimestamp"] = now()
            meta["deletionGracePeriodSeconds"] = 0
            meta["finalizers"] = sorted(set(meta.get("finalizers") or []) |
                                        {"foregroundDeletion"})
            owner = self.store.put(res, owner)
        self._waiting[meta["uid"]] = (res, meta.get("namespace", ""), meta["name"])
        for dep_res, dep in self.dependents(meta["uid"]):
            self.delete(dep_res, dep, "Foreground")
        self.settle()
        return owner

    def settle(self) -> None:
        """Remove foreground-deleted owners whose dependents are all gone (called after
        every removal)."""
        for uid, (res, ns, name) in list(self._waiting.items()):
            if not self.dependents(uid):
                del self._waiting[uid]
                self.store.remove(res, ns, name)
                self.settle()
                return

    def orphaned(self, obj: JSON) -> bool:
        """True if every ownerReference points at an object that no longer exists: the
        garbage collector deletes such objects (e.g. a pod created for a just-deleted Job)."""
        refs = obj["metadata"].get("ownerReferences") or []
        if not refs:
            return False
        for ref in refs:
            res = kind_resource(ref.get("apiVersion", ""), ref.get("kind", ""))
            if res is None:
                return False
            owner = self.store.get(res, obj["metadata"].get("namespace", "")
                                   if res.namespaced else "", ref.get("name", ""))
            if owner is not None and owner["metadata"]["uid"] == ref.get("uid"):
                return False
        return True


def kind_resource(api_version: str, kind: str) -> Resource | None:
    return BY_KIND.get((api_version, kind))
