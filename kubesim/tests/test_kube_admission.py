"""The emulator refuses what a real API server refuses: each rule it enforces (RBAC, Pod
Security, LimitRange, ResourceQuota) shown with the real server's status and message, over real
HTTP with bearer tokens."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from kubesim import KubeCluster
from kubesim.objects import JSON
from kubesim.rbac import ADMIN_TOKEN, grant
from tests.polling import wait_for

NS = "tunehub"
SA = f"system:serviceaccount:{NS}:worker"


class As:
    """HTTP to the emulator as one identity (a bearer token, or none)."""

    def __init__(self, kube: KubeCluster, token: str | None) -> None:
        self.kube = kube
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def __call__(self, method: str, path: str, body: Any = None,
                 **params: str) -> httpx.Response:
        headers = dict(self.headers)
        if method == "PATCH":
            headers["Content-Type"] = "application/merge-patch+json"
        return httpx.request(method, self.kube.url + path, json=body, params=params,
                             headers=headers, timeout=30)


def worker(kube: KubeCluster, rules: list[JSON], cluster_rules: list[JSON] | None = None) -> As:
    """ServiceAccount ``worker`` bound to a Role with ``rules`` (and a ClusterRole)."""
    kube.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "worker"}})
    subject = [{"kind": "ServiceAccount", "name": "worker", "namespace": NS}]
    kube.apply(grant("worker", rules, subject))
    if cluster_rules:
        kube.apply(grant("worker-nodes", cluster_rules, subject, cluster=True))
    return As(kube, kube.emulator.rbac.issue_token(NS, "worker"))


def forbidden(r: httpx.Response, message: str) -> None:
    assert r.status_code == 403, r.text
    body = r.json()
    assert body["kind"] == "Status" and body["reason"] == "Forbidden", body
    assert body["message"] == message


SAFE_CONTAINER = {"securityContext": {
    "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}}}


def pod(name: str, container: JSON | None = None, **spec: Any) -> JSON:
    c = {"name": "c", "image": "python", "command": ["python", "-c", "print('ran')"],
         **(container or {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "containers": [c], **spec}}


def job(name: str, container: JSON | None = None, **spec: Any) -> JSON:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"backoffLimit": 0, "template": {"spec": pod(name, container,
                                                                  **spec)["spec"]}}}


# --- authentication and RBAC ---------------------------------------------------------------

def test_tokens_authenticate_and_unknown_ones_are_401(kube: KubeCluster) -> None:
    anonymous = As(kube, None)
    forbidden(anonymous("GET", f"/api/v1/namespaces/{NS}/pods"),
              'pods is forbidden: User "system:anonymous" cannot list resource "pods" in API '
              f'group "" in the namespace "{NS}"')
    assert anonymous("GET", "/version").status_code == 200  # public, like a real cluster
    forbidden(anonymous("GET", "/apis"),
              'forbidden: User "system:anonymous" cannot get path "/apis"')
    # nonResourceURLs rules of a ClusterRole open paths to whom they are bound.
    kube.grant_anonymous([])
    assert anonymous("GET", "/apis").status_code == 200
    forbidden(anonymous("GET", f"/api/v1/namespaces/{NS}/pods"),
              'pods is forbidden: User "system:anonymous" cannot list resource "pods" in API '
              f'group "" in the namespace "{NS}"')
    bad = As(kube, "not-a-token")("GET", "/api/v1/nodes")
    assert bad.status_code == 401 and bad.json()["reason"] == "Unauthorized"
    admin = As(kube, ADMIN_TOKEN)
    assert admin("GET", "/api/v1/nodes").status_code == 200
    # A ServiceAccount's token dies with the account.
    sa = worker(kube, [])
    assert sa("GET", "/apis").status_code == 200  # discovery: any authenticated user
    assert admin("DELETE", f"/api/v1/namespaces/{NS}/serviceaccounts/worker").status_code == 200
    assert sa("GET", "/apis").status_code == 401


def test_role_grants_exactly_its_verbs_resources_and_names(kube: KubeCluster) -> None:
    sa = worker(kube, [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
        {"apiGroups": ["batch"], "resources": ["jobs/status"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"],
         "resourceNames": ["mine"]},
    ], cluster_rules=[{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}])
    kube.create(pod("p", SAFE_CONTAINER))
    kube.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "mine"}})
    kube.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "theirs"}})
    base = f"/api/v1/namespaces/{NS}"
    assert sa("GET", f"{base}/pods").status_code == 200
    assert sa("GET", f"{base}/pods/p").status_code == 200
    # list is not watch, pods is not pods/log, jobs/status is not jobs.
    forbidden(sa("GET", f"{base}/pods", watch="true"),
              f'pods is forbidden: User "{SA}" cannot watch resource "pods" in API group "" '
              f'in the namespace "{NS}"')
    forbidden(sa("GET", f"{base}/pods/p/log"),
              f'pods "p" is forbidden: User "{SA}" cannot get resource "pods/log" in API '
              f'group "" in the namespace "{NS}"')
    forbidden(sa("POST", f"/apis/batch/v1/namespaces/{NS}/jobs", job("j", SAFE_CONTAINER)),
              f'jobs.batch is forbidden: User "{SA}" cannot create resource "jobs" in API '
              f'group "batch" in the namespace "{NS}"')
    assert kube.get("jobs", "j") is None  # refused before any effect
    assert sa("GET", f"/apis/batch/v1/namespaces/{NS}/jobs/nope/status").status_code == 404
    forbidden(sa("GET", f"/apis/batch/v1/namespaces/{NS}/jobs/nope"),
              f'jobs.batch "nope" is forbidden: User "{SA}" cannot get resource "jobs" in API '
              f'group "batch" in the namespace "{NS}"')
    # resourceNames: this Secret, no other, and never a list.
    assert sa("GET", f"{base}/secrets/mine").status_code == 200
    forbidden(sa("GET", f"{base}/secrets/theirs"),
              f'secrets "theirs" is forbidden: User "{SA}" cannot get resource "secrets" in '
              f'API group "" in the namespace "{NS}"')
    assert sa("GET", f"{base}/secrets").status_code == 403
    # A Role binds in its namespace only; the ClusterRoleBinding reaches cluster scope.
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}})
    forbidden(sa("GET", "/api/v1/namespaces/other/pods"),
              f'pods is forbidden: User "{SA}" cannot list resource "pods" in API group "" in '
              'the namespace "other"')
    assert sa("GET", "/api/v1/nodes").status_code == 200
    forbidden(sa("GET", "/api/v1/nodes/cpu-0"),
              f'nodes "cpu-0" is forbidden: User "{SA}" cannot get resource "nodes" in API '
              'group "" at the cluster scope')
    # What was used against what was granted, for the least-privilege checks.
    assert kube.exercised("worker") == {("", "pods", "get"), ("", "pods", "list"),
                                        ("batch", "jobs/status", "get"),
                                        ("", "secrets", "get"), ("", "nodes", "list")}
    assert ("", "pods/log", "get") in kube.exercised("worker", allowed=False)
    assert kube.granted("worker") == {("", "pods", "get"), ("", "pods", "list"),
                                      ("batch", "jobs/status", "get"), ("", "secrets", "get"),
                                      ("", "nodes", "list")}


def test_group_subjects_and_wildcards(kube: KubeCluster) -> None:
    sa = worker(kube, [])
    kube.apply(grant("read-all", [{"apiGroups": ["*"], "resources": ["*/status"],
                                   "verbs": ["*"]}],
                     [{"kind": "Group", "name": f"system:serviceaccounts:{NS}",
                       "apiGroup": "rbac.authorization.k8s.io"}]))
    kube.create(pod("p", SAFE_CONTAINER))
    assert sa("GET", f"/api/v1/namespaces/{NS}/pods/p/status").status_code == 200
    assert sa("GET", f"/api/v1/namespaces/{NS}/pods/p").status_code == 403


# --- Pod Security Admission ----------------------------------------------------------------

@pytest.fixture
def restricted(kube: KubeCluster) -> As:
    kube.label_namespace({"pod-security.kubernetes.io/enforce": "restricted"})
    return As(kube, ADMIN_TOKEN)


PODS = f"/api/v1/namespaces/{NS}/pods"


def test_restricted_refuses_a_pod_without_a_security_context(
        kube: KubeCluster, restricted: As) -> None:
    forbidden(restricted("POST", PODS, pod("bare")),
              'pods "bare" is forbidden: violates PodSecurity "restricted:latest": '
              'allowPrivilegeEscalation != false (container "c" must set '
              'securityContext.allowPrivilegeEscalation=false), unrestricted capabilities '
              '(container "c" must set securityContext.capabilities.drop=["ALL"]), '
              'runAsNonRoot != true (pod or container "c" must set '
              'securityContext.runAsNonRoot=true), seccompProfile (pod or container "c" must '
              'set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")')
    assert kube.get("pods", "bare") is None
    # Pod-level settings count for every container; NET_BIND_SERVICE may be added.
    ok = pod("ok", {"securityContext": {"allowPrivilegeEscalation": False, "capabilities": {
        "drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}},
        securityContext={"runAsNonRoot": True, "seccompProfile": {"type": "Localhost",
                                                                  "localhostProfile": "p.json"}},
        volumes=[{"name": "scratch", "emptyDir": {}}])
    assert restricted("POST", PODS, ok).status_code == 201
    wait_for(lambda: "ran" in kube.pod_log("ok"), 30, "the compliant pod to run")


@pytest.mark.parametrize(("change", "message"), [
    ({"container": {"privileged": True}},
     'privileged (container "c" must not set securityContext.privileged=true)'),
    ({"spec": {"hostNetwork": True, "hostPID": True}},
     "host namespaces (hostNetwork=true, hostPID=true)"),
    ({"spec": {"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}},
     'restricted volume types (volume "h" uses restricted volume type "hostPath")'),
    ({"container": {"runAsUser": 0}},
     'runAsUser=0 (container "c" must not set runAsUser=0)'),
    ({"container": {"capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}},
     'unrestricted capabilities (container "c" must not include "SYS_ADMIN" in '
     "securityContext.capabilities.add)"),
    ({"container": {"seccompProfile": {"type": "Unconfined"}}},
     'seccompProfile (container "c" must not set securityContext.seccompProfile.type to '
     '"Unconfined")'),
    ({"container": {"allowPrivilegeEscalation": True}},
     'allowPrivilegeEscalation != false (container "c" must set '
     "securityContext.allowPrivilegeEscalation=false)"),
    ({"container": {"runAsNonRoot": False}},
     'runAsNonRoot != true (container "c" must not set securityContext.runAsNonRoot=false)'),
    ({"ports": [{"containerPort": 80, "hostPort": 80}]},
     'hostPort (container "c" uses hostPort 80)'),
])
def test_each_restricted_rule_refuses_its_violation(
        kube: KubeCluster, restricted: As, change: JSON, message: str) -> None:
    sc = {**SAFE_CONTAINER["securityContext"], **change.get("container", {})}
    body = pod("p", {"securityContext": sc, **({"ports": change["ports"]}
                                               if "ports" in change else {})},
               **change.get("spec", {}))
    forbidden(restricted("POST", PODS, body),
              f'pods "p" is forbidden: violates PodSecurity "restricted:latest": {message}')


def test_baseline_allows_defaults_but_not_privilege(kube: KubeCluster) -> None:
    kube.label_namespace({"pod-security.kubernetes.io/enforce": "baseline",
                          "pod-security.kubernetes.io/enforce-version": "v1.36"})
    admin = As(kube, ADMIN_TOKEN)
    assert admin("POST", PODS, pod("plain")).status_code == 201
    forbidden(admin("POST", PODS, pod("root", {"securityContext": {"privileged": True}})),
              'pods "root" is forbidden: violates PodSecurity "baseline:v1.36": privileged '
              '(container "c" must not set securityContext.privileged=true)')


def test_a_jobs_violating_pods_are_refused_and_the_job_says_why(
        kube: KubeCluster, restricted: As) -> None:
    """Like the real plugin: the Job is admitted with a warning, its pods are refused, and the
    Job controller reports FailedCreate (and keeps trying)."""
    r = restricted("POST", f"/apis/batch/v1/namespaces/{NS}/jobs",
                   job("j", {"securityContext": {**SAFE_CONTAINER["securityContext"],
                                                 "privileged": True}}))
    assert r.status_code == 201, r.text
    assert r.headers["Warning"].startswith('299 - "would violate PodSecurity '
                                           '\\"restricted:latest\\": privileged (container')

    def failed_create() -> list[JSON]:
        return [e for e in kube.objects("events") if e["reason"] == "FailedCreate"
                and e["involvedObject"]["name"] == "j"]

    (event,) = wait_for(failed_create, 30, "the Job controller's FailedCreate event")
    assert event["type"] == "Warning"
    assert event["message"].startswith('Error creating: pods "j-')
    assert event["message"].endswith('is forbidden: violates PodSecurity "restricted:latest": '
                                     'privileged (container "c" must not set '
                                     "securityContext.privileged=true)")
    assert kube.objects("pods") == []


# --- LimitRange and ResourceQuota ----------------------------------------------------------

def test_limit_range_defaults_and_bounds(kube: KubeCluster) -> None:
    kube.create({"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "limits"},
                 "spec": {"limits": [{"type": "Container",
                                      "default": {"cpu": "1", "memory": "512Mi"},
                                      "defaultRequest": {"cpu": "250m"},
                                      "max": {"cpu": "2"}}]}})
    admin = As(kube, ADMIN_TOKEN)
    r = admin("POST", PODS, pod("defaulted"))
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["containers"][0]["resources"] == {
        "limits": {"cpu": "1", "memory": "512Mi"},
        "requests": {"cpu": "250m", "memory": "512Mi"}}
    forbidden(admin("POST", PODS, pod("big", {"resources": {"limits": {"cpu": "4"}}})),
              'pods "big" is forbidden: maximum cpu usage per Container is 2, but limit is 4')


def test_quota_refuses_pods_over_it_and_tracks_usage(kube: KubeCluster) -> None:
    kube.create({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "compute"},
                 "spec": {"hard": {"requests.cpu": "1", "requests.memory": "1Gi",
                                   "pods": "5", "count/jobs.batch": "1"}}})
    admin = As(kube, ADMIN_TOKEN)
    forbidden(admin("POST", PODS, pod("unsized")),
              'pods "unsized" is forbidden: failed quota: compute: must specify '
              "requests.cpu for: c; requests.memory for: c")
    sleeper = {"command": ["python", "-c", "import time; time.sleep(60)"],
               "resources": {"requests": {"cpu": "600m", "memory": "256Mi"}}}
    assert admin("POST", PODS, pod("first", sleeper)).status_code == 201
    forbidden(admin("POST", PODS, pod("second", sleeper)),
              'pods "second" is forbidden: exceeded quota: compute, requested: '
              "requests.cpu=600m, used: requests.cpu=600m, limited: requests.cpu=1")
    quota = kube.get("resourcequotas", "compute")
    assert quota is not None and quota["status"]["used"] == {
        "requests.cpu": "600m", "requests.memory": "256Mi", "pods": "1",
        "count/jobs.batch": "0"}
    assert admin("POST", f"/apis/batch/v1/namespaces/{NS}/jobs",
                 job("j1", {"resources": {"requests": {"cpu": "100m",
                                                       "memory": "1Mi"}}})).status_code == 201
    forbidden(admin("POST", f"/apis/batch/v1/namespaces/{NS}/jobs", job("j2")),
              'jobs.batch "j2" is forbidden: exceeded quota: compute, requested: '
              "count/jobs.batch=1, used: count/jobs.batch=1, limited: count/jobs.batch=1")


def test_job_pods_wait_for_quota_and_run_when_it_frees(kube: KubeCluster) -> None:
    kube.create({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpus"},
                 "spec": {"hard": {"requests.nvidia.com/gpu": "1"}}})
    gate = kube.data_dir / "gate"
    hold = {"command": ["python", "-c", f"import os, time\nwhile not os.path.exists("
                                        f"{str(gate)!r}): time.sleep(0.1)"],
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    gpu = {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}
    admin = As(kube, ADMIN_TOKEN)
    jobs = f"/apis/batch/v1/namespaces/{NS}/jobs"
    assert admin("POST", jobs, job("holder", hold, **gpu)).status_code == 201
    wait_for(lambda: [p for p in kube.objects("pods", label_selector="job-name=holder")
                      if p["status"].get("phase") == "Running"], 30, "the holder to run")
    assert admin("POST", jobs, job("waiter", {"resources": {"limits": {
        "nvidia.com/gpu": "1"}}}, **gpu)).status_code == 201

    def refused() -> list[JSON]:
        return [e for e in kube.objects("events") if e["reason"] == "FailedCreate"
                and e["involvedObject"]["name"] == "waiter"]

    (event,) = wait_for(refused, 30, "the waiter's FailedCreate event")
    assert "exceeded quota: gpus, requested: requests.nvidia.com/gpu=1, used: " \
           "requests.nvidia.com/gpu=1, limited: requests.nvidia.com/gpu=1" in event["message"]
    waiter = kube.get("jobs", "waiter")
    assert waiter is not None and not (waiter.get("status") or {}).get("failed")
    gate.write_text("")  # the holder finishes: its GPU request no longer counts

    def completed() -> bool:
        found = kube.get("jobs", "waiter")
        return any(c["type"] == "Complete" for c in ((found or {}).get("status") or {}).get(
            "conditions") or [])

    wait_for(completed, 60, "the waiting Job to get its pod and complete")
