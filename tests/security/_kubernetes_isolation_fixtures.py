"""An emulated cluster whose pods run as their own uid, and NetworkPolicy evaluation.

The ``kube`` fixture's pods run as the test's user (root here), so file permissions between a
trial and the tuner are not what a node makes them. :func:`uid_cluster` runs each container as
its ``runAsUser`` with the pod's ``fsGroup`` (kubesim's ``Runtime.run_as_users``) in
directories every uid may traverse (pytest's ``tmp_path`` is root-only), under the chart's
RBAC and Pod Security level, with the environment the chart gives the tuner. The trials' group
is a group of the test's own, granted passage to the Python running the tests (pyenv under
``/root`` here), as :func:`tests.hub_fixtures.system_users_for_test` does for people.

:func:`reachable` answers "may pod A open a connection to pod B, on some port, and on which
ports" from the NetworkPolicies stored in the cluster, the way a CNI plugin enforcing them
decides: a pod selected by no policy of a direction is open in it; otherwise some rule of a
policy selecting it must admit the peer, in both directions (egress of A, ingress of B).
"""

from __future__ import annotations

import grp
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from kubesim import KubeCluster
from tests.chart_security import install_chart_security, tuner_kubeconfig
from tunehub_base import unix_users

REPO = Path(__file__).resolve().parents[2]

#: Every port: what a rule without ``ports`` admits.
ANY_PORT = "any"


@contextmanager
def uid_cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[KubeCluster]:
    """A running cluster (namespace ``tunehub``) whose containers run as their uid, the
    chart's RBAC installed and the tuner's environment set (its ServiceAccount's kubeconfig,
    tunehub's home inside the data volume, the sweep PriorityClasses)."""
    if os.geteuid() != 0:
        pytest.fail("running pods as their own uid needs root (as these machines run tests)")
    group = f"th{secrets.token_hex(3)}-trials"
    subprocess.run(["groupadd", "--system", group], check=True)
    gid = grp.getgrnam(group).gr_gid
    granted = unix_users.grant_passage(gid, unix_users.closed_ancestors(
        [Path(sys.executable), Path(sys.base_prefix), REPO]))
    top = Path(tempfile.mkdtemp(prefix="kube-uid-"))
    top.chmod(0o755)
    cluster = KubeCluster(top / "kube", data_dir=top / "data")
    cluster.runtime.run_as_users = True
    cluster.start()
    try:
        install_chart_security(cluster)
        monkeypatch.setenv("TUNEHUB_K8S_RUN_AS_GROUP", str(gid))
        monkeypatch.setenv("KUBECONFIG", str(tuner_kubeconfig(cluster)))
        monkeypatch.setenv("TUNEHUB_DATA", str(cluster.data_dir))
        monkeypatch.setenv("TUNEHUB_HOME", str(cluster.data_dir / ".tunehub"))
        monkeypatch.setenv("TUNEHUB_K8S_UNSCHEDULABLE_TIMEOUT", "0")
        for value, priority in ((10, "low"), (100, "normal"), (500, "high")):
            cluster.create({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                            "metadata": {"name": f"tunehub-sweep-{priority}"}, "value": value})
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(top, ignore_errors=True)
        unix_users.revoke_passage(gid, granted)
        subprocess.run(["groupdel", group], check=False, capture_output=True)


def kubeconfig_token(path: Path) -> tuple[str, str]:
    """``(server URL, bearer token)`` of a kubeconfig the emulator wrote."""
    import yaml

    cfg = yaml.safe_load(path.read_text())
    return cfg["clusters"][0]["cluster"]["server"], cfg["users"][0]["user"]["token"]


# --- NetworkPolicy evaluation ------------------------------------------------------------

def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector (matchLabels, matchExpressions) against ``labels``; ``{}`` is all."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        ok = {"In": key in labels and labels[key] in values,
              "NotIn": labels.get(key) not in values,
              "Exists": key in labels,
              "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True


def _peer_admits(peer: dict[str, Any], other: dict[str, Any]) -> bool:
    """One ``from``/``to`` peer against a pod of the same namespace (no namespaceSelector:
    the policy's namespace; an ipBlock never names a pod by its labels)."""
    if "ipBlock" in peer:
        return False
    if "namespaceSelector" in peer and not matches(peer["namespaceSelector"], {}):
        return False  # another namespace's pods only (this emulator has one)
    return matches(peer.get("podSelector") or {}, other["metadata"].get("labels") or {})


def _ports(policies: list[dict[str, Any]], pod: dict[str, Any], other: dict[str, Any],
           direction: str) -> set[Any] | None:
    """Ports ``pod`` admits with ``other`` in ``direction`` (``ingress``: from ``other``,
    ``egress``: to it); None when no policy of that direction selects ``pod`` (all open)."""
    kind = direction.capitalize()
    selecting = [p for p in policies
                 if matches(p["spec"]["podSelector"], pod["metadata"].get("labels") or {})
                 and kind in (p["spec"].get("policyTypes") or ["Ingress"])]
    if not selecting:
        return None
    key = "from" if direction == "ingress" else "to"
    ports: set[Any] = set()
    for policy in selecting:
        for rule in policy["spec"].get(direction) or []:
            peers = rule.get(key)
            if peers is not None and not any(_peer_admits(p, other) for p in peers):
                continue
            if not rule.get("ports"):
                ports.add(ANY_PORT)
            else:
                ports.update((p.get("protocol", "TCP"), p.get("port")) for p in rule["ports"])
    return ports


def reachable(policies: list[dict[str, Any]], src: dict[str, Any], dst: dict[str, Any]
              ) -> set[Any] | None:
    """The ports ``src`` may connect to on ``dst`` (:data:`ANY_PORT` for every port), or
    None when neither side is under any policy; an empty set: nothing gets through."""
    out_ = _ports(policies, src, dst, "egress")
    in_ = _ports(policies, dst, src, "ingress")
    if out_ is None and in_ is None:
        return None
    if out_ is None or in_ is None:
        return out_ if in_ is None else in_
    if ANY_PORT in out_:
        return in_
    if ANY_PORT in in_:
        return out_
    return out_ & in_


def describe_pods(pods: list[dict[str, Any]]) -> str:
    return json.dumps([p["metadata"]["name"] for p in pods])
