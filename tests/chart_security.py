"""The chart's security on the emulated cluster: the ServiceAccounts, Roles and RoleBindings the
Helm chart renders, and the namespace labelled with the Pod Security level the chart documents
(helm/tunehub/README.md, NOTES.txt). Kubernetes-mode tests run the hub and the tuner with
these identities, so a verb the chart's Role lacks is a 403 there, as on a real cluster, and
every pod they create must pass ``restricted``."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

from kubesim import KubeCluster
from tests.test_hub_kube_config import RELEASE, example_values, render

RBAC_KINDS = ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
HUB_ACCOUNT = f"{RELEASE}-hub"
TUNER_ACCOUNT = f"{RELEASE}-tuner"
#: The namespace label the chart documents; its pods must all pass it.
POD_SECURITY = {"pod-security.kubernetes.io/enforce": "restricted"}


@functools.lru_cache(maxsize=4)
def _rendered_rbac(namespace: str) -> tuple[dict[str, Any], ...]:
    """Rendering takes seconds: once per namespace and test session."""
    return tuple(o for o in render(example_values(), namespace=namespace)
                 if o["kind"] in RBAC_KINDS)


def chart_rbac(namespace: str) -> list[dict[str, Any]]:
    """The chart's RBAC objects for a release in ``namespace`` (copies)."""
    return copy.deepcopy(list(_rendered_rbac(namespace)))


def install_chart_security(kube: KubeCluster) -> None:
    """The chart's ServiceAccounts and RBAC in the cluster; its namespace labelled as the
    chart documents."""
    kube.apply(chart_rbac(kube.namespace))
    kube.label_namespace(POD_SECURITY)


def tuner_kubeconfig(kube: KubeCluster) -> Path:
    """What the tuner pod's ServiceAccount token gives it (after install_chart_security)."""
    return kube.service_account_kubeconfig(TUNER_ACCOUNT)


def hub_kubeconfig(kube: KubeCluster) -> Path:
    return kube.service_account_kubeconfig(HUB_ACCOUNT)

