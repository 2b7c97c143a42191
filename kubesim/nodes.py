"""Fake nodes and the scheduler's filtering and scoring: node selectors, required and preferred
node affinity, taints vs tolerations and resource fit, with scheduler-like failure messages."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal

from .objects import JSON
from .validation import parse_quantity

GPU = "nvidia.com/gpu"
TERMINAL = ("Succeeded", "Failed")


@dataclass
class FakeNode:
    """A node the kubelet stand-in pretends to be. ``gpu_product`` becomes the
    ``nvidia.com/gpu.product`` label (as NVIDIA's GPU feature discovery sets it)."""

    name: str
    cpu: str = "8"
    memory: str = "32Gi"
    gpus: int = 0
    gpu_product: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[JSON] = field(default_factory=list)
    unschedulable: bool = False
    allocatable: dict[str, str] | None = None  # from a Node object: overrides cpu/memory/gpus

    @classmethod
    def from_object(cls, node: JSON) -> FakeNode:
        """The scheduler's view of a Node object (so tests can taint or cordon nodes through
        the API, as with kubectl)."""
        spec, status = node.get("spec") or {}, node.get("status") or {}
        return cls(node["metadata"]["name"], labels=dict(node["metadata"].get("labels") or {}),
                   taints=list(spec.get("taints") or []),
                   unschedulable=bool(spec.get("unschedulable")),
                   allocatable=dict(status.get("allocatable") or status.get("capacity") or {}))

    def all_labels(self) -> dict[str, str]:
        labels = {"kubernetes.io/hostname": self.name, "kubernetes.io/os": "linux",
                  "kubernetes.io/arch": "amd64"}
        if self.gpu_product:
            labels["nvidia.com/gpu.product"] = self.gpu_product
            labels["nvidia.com/gpu.count"] = str(self.gpus)
            labels["nvidia.com/gpu.present"] = "true"
        labels.update(self.labels)
        return labels

    def capacity(self) -> dict[str, str]:
        if self.allocatable is not None:
            return self.allocatable
        cap = {"cpu": self.cpu, "memory": self.memory, "pods": "110",
               "ephemeral-storage": "100Gi"}
        if self.gpus:
            cap[GPU] = str(self.gpus)
        return cap

    def to_object(self) -> JSON:
        spec: JSON = {}
        if self.taints:
            spec["taints"] = self.taints
        if self.unschedulable:
            spec["unschedulable"] = True
        return {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": self.name, "labels": self.all_labels()}, "spec": spec,
                "status": {"capacity": self.capacity(), "allocatable": self.capacity(),
                           "conditions": [{"type": "Ready", "status": "True",
                                           "reason": "KubeletReady",
                                           "message": "kubelet is posting ready status"}],
                           "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                                         {"type": "Hostname", "address": self.name}]}}


def pod_requests(pod: JSON) -> dict[str, Decimal]:
    """Effective requests: the sum over containers, or the largest init container if bigger."""
    total: dict[str, Decimal] = {}
    for c in pod["spec"].get("containers", []):
        for k, v in ((c.get("resources") or {}).get("requests") or {}).items():
            total[k] = total.get(k, 0) + parse_quantity(v)
    for c in pod["spec"].get("initContainers") or []:
        for k, v in ((c.get("resources") or {}).get("requests") or {}).items():
            total[k] = max(total.get(k, Decimal(0)), parse_quantity(v))
    return total


def _expr_matches(expr: JSON, labels: dict[str, str]) -> bool:
    key, op, values = expr["key"], expr["operator"], expr.get("values") or []
    value = labels.get(key)
    if op == "In":
        return value in values
    if op == "NotIn":
        return value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and value.lstrip("-").isdigit():
        return int(value) > int(values[0]) if op == "Gt" else int(value) < int(values[0])
    return False


def _term_matches(term: JSON, labels: dict[str, str]) -> bool:
    exprs = term.get("matchExpressions") or []
    return bool(exprs) and all(_expr_matches(e, labels) for e in exprs)


def selector_matches(pod: JSON, labels: dict[str, str]) -> bool:
    spec = pod["spec"]
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if required:
        return any(_term_matches(t, labels) for t in required.get("nodeSelectorTerms", []))
    return True


def preference_score(pod: JSON, labels: dict[str, str]) -> int:
    prefs = (((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {})
             .get("preferredDuringSchedulingIgnoredDuringExecution") or [])
    return sum(p.get("weight", 0) for p in prefs if _term_matches(p["preference"], labels))


def untolerated_taint(pod: JSON, node: FakeNode) -> JSON | None:
    tolerations = pod["spec"].get("tolerations") or []
    for taint in node.taints:
        if taint.get("effect") == "PreferNoSchedule":
            continue
        ok = False
        for t in tolerations:
            if t.get("effect") and t["effect"] != taint.get("effect"):
                continue
            if t.get("operator") == "Exists":
                ok = not t.get("key") or t["key"] == taint["key"]
            else:
                ok = t.get("key") == taint["key"] and t.get("value", "") == taint.get("value", "")
            if ok:
                break
        if not ok:
            return taint
    return None


def node_usage(node: str, pods: list[JSON]) -> dict[str, Decimal]:
    used: dict[str, Decimal] = {}
    for p in pods:
        if p["spec"].get("nodeName") == node and p["status"].get("phase") not in TERMINAL:
            for k, v in pod_requests(p).items():
                used[k] = used.get(k, 0) + v
            used["pods"] = used.get("pods", Decimal(0)) + 1
    return used


def insufficient(pod: JSON, node: FakeNode, used: dict[str, Decimal]) -> list[str]:
    """Resources the node cannot provide for ``pod`` given what is already ``used``."""
    cap = {k: parse_quantity(v) for k, v in node.capacity().items()}
    need = pod_requests(pod)
    need["pods"] = Decimal(1)
    return sorted(k for k, v in need.items() if v > 0 and used.get(k, 0) + v > cap.get(k, 0))


def filter_node(pod: JSON, node: FakeNode, pods: list[JSON]) -> list[str]:
    """Why ``pod`` cannot run on ``node`` (empty list: it fits), in the scheduler's words."""
    if node.unschedulable:
        return ["node(s) were unschedulable"]
    if not selector_matches(pod, node.all_labels()):
        return ["node(s) didn't match Pod's node affinity/selector"]
    taint = untolerated_taint(pod, node)
    if taint is not None:
        value = f": {taint['value']}" if taint.get("value") else ""
        return [f"node(s) had untolerated taint {{{taint['key']}{value}}}"]
    return [f"Insufficient {r}" for r in insufficient(pod, node, node_usage(node.name, pods))]


def failure_message(reasons: dict[str, list[str]]) -> str:
    counts: Counter[str] = Counter(r for rs in reasons.values() for r in rs)
    detail = ", ".join(f"{n} {r}" for r, n in sorted(counts.items()))
    return f"0/{len(reasons)} nodes are available: {detail}."


def choose_node(pod: JSON, nodes: list[FakeNode], pods: list[JSON]) -> tuple[str | None, str]:
    """The best feasible node (highest preferred-affinity score, then fewest allocated
    resources, then configuration order), or None and the FailedScheduling message."""
    reasons = {n.name: filter_node(pod, n, pods) for n in nodes}
    feasible = [n for n in nodes if not reasons[n.name]]
    if not feasible:
        if not nodes:
            return None, "no nodes available to schedule pods"
        return None, failure_message(reasons)
    best = max(feasible, key=lambda n: (preference_score(pod, n.all_labels()),
                                        -len([p for p in pods
                                              if p["spec"].get("nodeName") == n.name]),
                                        -nodes.index(n)))
    return best.name, ""


def preemption_victims(pod: JSON, nodes: list[FakeNode], pods: list[JSON]
                       ) -> tuple[str, list[JSON]] | None:
    """Lower-priority pods whose removal lets ``pod`` fit on some node (fewest victims)."""
    if pod["spec"].get("preemptionPolicy") == "Never":
        return None
    prio = pod["spec"].get("priority", 0)
    best: tuple[str, list[JSON]] | None = None
    for node in nodes:
        if not selector_matches(pod, node.all_labels()) or untolerated_taint(pod, node):
            continue
        running = [p for p in pods if p["spec"].get("nodeName") == node.name
                   and p["status"].get("phase") not in TERMINAL
                   and not p["metadata"].get("deletionTimestamp")]
        lower = sorted((p for p in running if p["spec"].get("priority", 0) < prio),
                       key=lambda p: p["spec"].get("priority", 0))
        victims: list[JSON] = []
        remaining = list(running)
        for v in lower:
            if not insufficient(pod, node, node_usage(node.name, remaining)):
                break
            victims.append(v)
            remaining.remove(v)
        if victims and not insufficient(pod, node, node_usage(node.name, remaining)) and (
                best is None or len(victims) < len(best[1])):
            best = (node.name, victims)
    return best
