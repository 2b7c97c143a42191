"""The Kubernetes test harness itself, exercised the way our code and KubeSpawner use a
cluster: kubernetes-asyncio over real HTTP against the emulator, with pods really running as
local processes."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.rest import ApiException

from kubesim.cluster import KubeCluster
from kubesim.objects import JSON
from kubesim.waiting import eventually

NS = "tunehub"


@pytest.fixture
async def api(kube: KubeCluster) -> AsyncIterator[client.ApiClient]:
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(kube.kubeconfig), client_configuration=cfg)
    async with client.ApiClient(cfg) as api_client:
        yield api_client


def request_body(obj: Mapping[str, object]) -> Any:
    """``obj`` as a kubernetes-asyncio request body: the client serialises a plain dict as it
    is (these tests send JSON as our code does), but its methods are typed for its models."""
    return obj


def job_body(name: str, code: str, **spec: Any) -> JSON:
    container: JSON = {"name": "main", "image": "python:3.11",
                       "command": ["python", "-c", code]}
    container.update(spec.pop("container", {}))
    pod_spec: JSON = {"restartPolicy": "Never", "containers": [container]}
    pod_spec.update(spec.pop("pod", {}))
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"backoffLimit": 0, "template": {"spec": pod_spec}, **spec}}


def present(obj: JSON | None) -> JSON:
    """``obj``, which the test expects to be there (an object, a condition)."""
    assert obj is not None
    return obj


def api_status(exc: ApiException) -> JSON:
    """The Status object an API error carries."""
    assert exc.body is not None
    status: JSON = json.loads(exc.body)
    return status


def condition(obj: JSON, type_: str) -> JSON | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == type_ and c["status"] == "True":
            return c
    return None


async def finished_job(kube: KubeCluster, name: str, timeout: float = 60) -> JSON:
    async def done() -> JSON | None:
        job = kube.get("jobs", name)
        return job if job and (condition(job, "Complete") or condition(job, "Failed")) else None

    return await eventually(done, timeout, f"job {name} to finish")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie still answers kill(0): look at its state
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


async def test_invalid_object_is_refused_with_422(kube: KubeCluster,
                                                  api: client.ApiClient) -> None:
    batch = client.BatchV1Api(api)
    body = job_body("bad", "print(1)", container={"resourcez": {}})
    with pytest.raises(ApiException) as err:
        await batch.create_namespaced_job(NS, request_body(body))
    assert err.value.status == 422
    status = api_status(err.value)
    assert status["kind"] == "Status" and status["reason"] == "Invalid"
    assert "spec.template.spec.containers[0]" in status["message"]
    assert "resourcez" in status["message"]
    with pytest.raises(ApiException) as err:  # GPU requests must equal limits
        await batch.create_namespaced_job(NS, request_body(job_body(
            "gpu", "1", container={"resources": {
                "requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "2"}}})))
    assert err.value.status == 422 and "nvidia.com/gpu" in api_status(err.value)["message"]
    with pytest.raises(ApiException) as err:
        await client.CoreV1Api(api).read_namespaced_pod("nope", NS)
    assert err.value.status == 404 and api_status(err.value)["reason"] == "NotFound"
    assert kube.objects("jobs") == []


async def test_already_exists_and_conflict(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "1"}}
    created = await core.create_namespaced_config_map(NS, request_body(cm))
    with pytest.raises(ApiException) as err:
        await core.create_namespaced_config_map(NS, request_body(cm))
    assert err.value.status == 409 and api_status(err.value)["reason"] == "AlreadyExists"
    await core.patch_namespaced_config_map("c", NS, {"data": {"a": "2"}})
    stale = {**cm, "metadata": {"name": "c",
                                "resourceVersion": created.metadata.resource_version}}
    with pytest.raises(ApiException) as err:
        await core.replace_namespaced_config_map("c", NS, request_body(stale))
    assert err.value.status == 409 and api_status(err.value)["reason"] == "Conflict"


async def test_watch_replays_from_resource_version_and_410_when_compacted(
        kube: KubeCluster, api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    start = (await core.list_namespaced_config_map(NS)).metadata.resource_version
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "w"}, "data": {"a": "1"}}
    await core.create_namespaced_config_map(NS, request_body(cm))
    await core.patch_namespaced_config_map("w", NS, {"data": {"a": "2"}})
    await core.delete_namespaced_config_map("w", NS)
    seen = []
    stream = watch.Watch().stream(core.list_namespaced_config_map, NS, resource_version=start,
                                  timeout_seconds=1)
    async for event in stream:
        seen.append((event["type"], int(event["object"].metadata.resource_version),
                     (event["object"].data or {}).get("a")))
    assert [t for t, _, _ in seen] == ["ADDED", "MODIFIED", "DELETED"]
    assert [rv for _, rv, _ in seen] == sorted(rv for _, rv, _ in seen)
    assert all(rv > int(start) for _, rv, _ in seen) and seen[1][2] == "2"
    kube.compact()
    with pytest.raises(ApiException) as err:
        async for _ in watch.Watch().stream(core.list_namespaced_config_map, NS,
                                            resource_version=start, timeout_seconds=1):
            pass
    assert err.value.status == 410


async def test_label_and_field_selectors(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    for name, labels in (("a", {"app": "x", "tier": "web"}), ("b", {"app": "y"}),
                         ("c", {"app": "z", "tier": "db"})):
        await core.create_namespaced_config_map(NS, request_body({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": labels}}))

    async def names(**kw: Any) -> list[str]:
        return [o.metadata.name for o in (await core.list_namespaced_config_map(NS, **kw)).items]

    assert await names(label_selector="app=x") == ["a"]
    assert await names(label_selector="app!=x") == ["b", "c"]
    assert await names(label_selector="app in (x, z)") == ["a", "c"]
    assert await names(label_selector="app notin (x,z)") == ["b"]
    assert await names(label_selector="tier") == ["a", "c"]
    assert await names(label_selector="!tier") == ["b"]
    assert await names(label_selector="app,tier=db") == ["c"]
    assert await names(field_selector="metadata.name=b") == ["b"]
    assert await names(field_selector="metadata.name!=b", label_selector="tier") == ["a", "c"]


async def test_job_pod_writes_into_mapped_claim_and_completes(
        kube: KubeCluster, api: client.ApiClient, tmp_path: Path) -> None:
    data = kube.map_claim("tunehub-data", tmp_path / "shared")
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    await core.create_namespaced_secret(NS, request_body({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "tok"},
        "stringData": {"token": "s3cret"}}))
    code = ("import os, pathlib; d = pathlib.Path(os.environ['TUNEHUB_DATA']);"
            "(d / 'out.txt').write_text(os.environ['TOKEN'] + ' ' + os.environ['POD'] + ' '"
            " + os.getcwd()); print('hello from the pod')")
    body = job_body("writer", code, container={
        "env": [{"name": "TUNEHUB_DATA", "value": str(data)},
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "tok", "key": "token"}}},
                {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "workingDir": str(data / "work"),
        "volumeMounts": [{"name": "data", "mountPath": str(data)}]},
        pod={"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "tunehub-data"}}]})
    await batch.create_namespaced_job(NS, request_body(body))
    job = await finished_job(kube, "writer")
    assert condition(job, "Complete"), job["status"]
    assert job["status"]["succeeded"] == 1
    pods = kube.objects("pods", label_selector="job-name=writer")
    assert len(pods) == 1 and pods[0]["status"]["phase"] == "Succeeded"
    pod = pods[0]["metadata"]["name"]
    assert (data / "out.txt").read_text() == f"s3cret {pod} {data / 'work'}"
    terminated = pods[0]["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 0 and terminated["reason"] == "Completed"
    log = await core.read_namespaced_pod_log(pod, NS)
    assert "hello from the pod" in log


async def test_pod_needing_8_gpus_stays_pending_unschedulable(
        kube: KubeCluster, api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    gpus = {"limits": {"nvidia.com/gpu": "8"}}
    pod: JSON = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "greedy"},
           "spec": {"restartPolicy": "Never", "containers": [
               {"name": "main", "image": "x", "command": ["python", "-c", "1"],
                "resources": gpus}]}}
    await core.create_namespaced_pod(NS, request_body(pod))

    async def unschedulable() -> JSON | None:
        p = await core.read_namespaced_pod("greedy", NS)
        for c in p.status.conditions or []:
            if c.type == "PodScheduled" and c.reason == "Unschedulable":
                return {"phase": p.status.phase, "message": c.message, "status": c.status}
        return None

    found = await eventually(unschedulable, 30, "the pod to be reported unschedulable")
    assert found["phase"] == "Pending" and found["status"] == "False"
    assert found["message"] == "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."

    async def scheduling_events() -> list[str] | None:
        # The scheduler writes its event after the condition: wait for it, do not race it.
        events = await core.list_namespaced_event(
            NS, field_selector="involvedObject.name=greedy,reason=FailedScheduling")
        return [e.message for e in events.items] or None

    messages = await eventually(scheduling_events, 30, "the FailedScheduling event")
    assert messages == [found["message"]]
    # the same pod asking for two T4s lands on the T4 node and runs
    t4: JSON = {**pod, "metadata": {"name": "t4"}}
    t4["spec"] = {**pod["spec"], "nodeSelector": {"nvidia.com/gpu.product": "Tesla-T4"},
                  "containers": [{**pod["spec"]["containers"][0],
                                  "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}
    await core.create_namespaced_pod(NS, request_body(t4))

    async def t4_done() -> JSON | None:
        p = kube.get("pods", "t4")
        return p if p and p["status"].get("phase") == "Succeeded" else None

    assert (await eventually(t4_done, 30, "the T4 pod"))["spec"]["nodeName"] == "gpu-t4-0"


async def test_delete_job_background_removes_pods_and_kills_process(
        kube: KubeCluster, api: client.ApiClient) -> None:
    batch = client.BatchV1Api(api)
    await batch.create_namespaced_job(
        NS, request_body(job_body("sleeper", "import time; time.sleep(600)")))

    async def running() -> int | None:
        return next(iter(kube.pids().values()), {}).get("main")

    pid = await eventually(running, 30, "the job's process to start")
    assert alive(pid)
    await batch.delete_namespaced_job("sleeper", NS, propagation_policy="Background")
    # running pods terminate gracefully: marked first, removed once the kubelet killed them
    assert all(p["metadata"].get("deletionTimestamp") for p in kube.objects("pods"))

    async def gone() -> bool:
        return not kube.objects("pods") and not alive(pid)

    await eventually(gone, 30, "pods deleted and the process killed")
    assert kube.objects("jobs") == []


async def test_delete_job_orphan_keeps_pods(kube: KubeCluster,
                                            api: client.ApiClient) -> None:
    batch = client.BatchV1Api(api)
    await batch.create_namespaced_job(
        NS, request_body(job_body("orphan", "import time; time.sleep(600)")))

    async def has_pod() -> list[JSON]:
        return kube.objects("pods", label_selector="job-name=orphan")

    await eventually(has_pod, 30, "the job's pod")
    await batch.delete_namespaced_job("orphan", NS, propagation_policy="Orphan")
    pods = kube.objects("pods", label_selector="job-name=orphan")
    assert len(pods) == 1 and "ownerReferences" not in pods[0]["metadata"]
    # The pod ignores SIGTERM, so it stays Terminating for its grace period: the Job is seen
    # marked while its pod is still there (a pod that exits at once could take the Job with it
    # before the test looks).
    stubborn = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "print('ignoring SIGTERM', flush=True); time.sleep(600)")
    await batch.create_namespaced_job(NS, request_body(job_body(
        "fg", stubborn, pod={"terminationGracePeriodSeconds": 5})))

    async def fg_pod() -> list[JSON]:
        return kube.objects("pods", label_selector="job-name=fg")

    await eventually(fg_pod, 30, "the second job's pod")

    async def ignoring() -> bool:  # SIGTERM before the handler is set would end the pod at once
        pod = (await fg_pod())[0]["metadata"]["name"]
        return "ignoring SIGTERM" in kube.pod_log(pod)

    await eventually(ignoring, 60, "the second job's pod to ignore SIGTERM")
    await batch.delete_namespaced_job("fg", NS, propagation_policy="Foreground")
    job = present(kube.get("jobs", "fg"))  # stays, marked, until its pods are gone
    assert job["metadata"]["finalizers"] == ["foregroundDeletion"]
    assert job["metadata"]["deletionTimestamp"]

    async def all_gone() -> bool:
        return not kube.objects("pods", label_selector="job-name=fg") and not kube.objects(
            "jobs")

    await eventually(all_gone, 30, "the pods, then the Job, to be deleted")


async def test_indexed_job_gets_completion_index(kube: KubeCluster,
                                                 api: client.ApiClient) -> None:
    data = kube.data_dir
    code = ("import os, pathlib; i = os.environ['JOB_COMPLETION_INDEX'];"
            f"pathlib.Path({str(data)!r}, 'idx-' + i).write_text(os.environ['HOSTNAME'])")
    body = job_body("idx", code, completions=3, parallelism=3, completionMode="Indexed",
                    container={"volumeMounts": [{"name": "d", "mountPath": str(data)}]},
                    pod={"volumes": [{"name": "d", "persistentVolumeClaim": {
                        "claimName": "tunehub-data"}}]})
    await client.BatchV1Api(api).create_namespaced_job(NS, request_body(body))
    job = await finished_job(kube, "idx")
    assert condition(job, "Complete"), job["status"]
    assert job["status"]["completedIndexes"] == "0-2" and job["status"]["succeeded"] == 3
    assert {p.name: p.read_text() for p in data.glob("idx-*")} == {
        f"idx-{i}": f"idx-{i}" for i in range(3)}
    annotations = {p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
                   for p in kube.objects("pods", label_selector="job-name=idx")}
    assert annotations == {"0", "1", "2"}


async def test_backoff_limit_and_deadline(kube: KubeCluster,
                                          api: client.ApiClient) -> None:
    batch = client.BatchV1Api(api)
    failing = job_body("fails", "import sys; sys.exit(3)")
    failing["spec"]["backoffLimit"] = 1
    await batch.create_namespaced_job(NS, request_body(failing))
    await batch.create_namespaced_job(NS, request_body(job_body(
        "slow", "import time; time.sleep(600)", activeDeadlineSeconds=1)))
    job = await finished_job(kube, "fails")
    assert present(condition(job, "Failed"))["reason"] == "BackoffLimitExceeded"
    assert job["status"]["failed"] == 2
    codes = [p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"]
             for p in kube.objects("pods", label_selector="job-name=fails")]
    assert codes == [3, 3]
    job = await finished_job(kube, "slow")
    assert present(condition(job, "Failed"))["reason"] == "DeadlineExceeded"

    async def no_slow_pods() -> bool:
        return not kube.objects("pods", label_selector="job-name=slow")

    await eventually(no_slow_pods, 30, "the deadline-exceeded pod to be deleted")


async def test_suspended_job_waits_until_resumed(kube: KubeCluster,
                                                 api: client.ApiClient) -> None:
    batch = client.BatchV1Api(api)
    await batch.create_namespaced_job(
        NS, request_body(job_body("held", "print('ran')", suspend=True)))

    async def suspended() -> JSON | None:
        job = kube.get("jobs", "held")
        return job if job and condition(job, "Suspended") else None

    await eventually(suspended, 30, "the Suspended condition")
    assert kube.objects("pods") == []
    await batch.patch_namespaced_job("held", NS, {"spec": {"suspend": False}})
    assert condition(await finished_job(kube, "held"), "Complete")


async def test_admission_errors_and_mount_mismatch(kube: KubeCluster,
                                                   api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    pod: JSON = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"restartPolicy": "Never", "priorityClassName": "nope",
                    "containers": [{"name": "m", "image": "x", "command": ["true"]}]}}
    with pytest.raises(ApiException) as err:
        await core.create_namespaced_pod(NS, request_body(pod))
    assert err.value.status == 403
    assert "no PriorityClass with name nope was found" in api_status(err.value)["message"]
    del pod["spec"]["priorityClassName"]
    pod["spec"]["volumes"] = [{"name": "d", "persistentVolumeClaim": {
        "claimName": "tunehub-data"}}]
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "d", "mountPath": "/data"}]
    await core.create_namespaced_pod(NS, request_body(pod))

    async def failed() -> JSON | None:
        p = kube.get("pods", "p")
        return p if p and p["status"].get("phase") == "Failed" else None

    status = (await eventually(failed, 30, "the pod to fail"))["status"]
    assert status["reason"] == "FailedMount"
    assert f"mount it at {kube.data_dir}" in status["message"]


async def test_counters_separate_client_requests_from_harness(
        kube: KubeCluster, api: client.ApiClient) -> None:
    kube.counters.reset()
    batch = client.BatchV1Api(api)
    await batch.create_namespaced_job(NS, request_body(job_body("count", "print(1)")))
    await finished_job(kube, "count")
    await batch.list_namespaced_job(NS)
    assert kube.counters.snapshot() == {("create", "jobs"): 1, ("list", "jobs"): 1}
    assert kube.counters.writes() == 1 and kube.counters.reads() == 1
    harness = kube.counters.snapshot("harness")
    assert harness[("create", "pods")] == 1 and harness[("create", "pods/binding")] == 1


async def test_kubespawner_objects_validate_and_notebook_pod_is_reachable(
        kube: KubeCluster, api: client.ApiClient, unused_tcp_port: int) -> None:
    """KubeSpawner's own object builders and reflector against the emulator: the pod passes
    schema validation, is scheduled on the requested GPU type, runs, and answers HTTP."""
    import httpx
    from kubespawner.objects import make_pod
    from kubespawner.reflector import NamespacedResourceReflector

    await config.load_kube_config(config_file=str(kube.kubeconfig))  # KubeSpawner's global
    scheduling = client.SchedulingV1Api(api)
    await scheduling.create_priority_class(request_body({
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
        "metadata": {"name": "notebooks"}, "value": 1000}))
    port = unused_tcp_port
    pod = make_pod(
        name="jupyter-alice", cmd=["python", "-m", "http.server", str(port)], port=port,
        image="tunehub/notebook:latest", labels={"component": "singleuser-server"},
        env={"JUPYTERHUB_USER": "alice"}, cpu_limit=2, mem_limit="4G",
        extra_resource_limits={"nvidia.com/gpu": "1"},
        node_selector={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        priority_class_name="notebooks", allow_privilege_escalation=False,
        working_dir=str(kube.data_dir), uid=os.getuid())
    reflector = NamespacedResourceReflector(kind="pods", namespace=NS,
                                            labels={"component": "singleuser-server"})
    await reflector.start()
    try:
        body = api.sanitize_for_serialization(pod)
        await client.CoreV1Api(api).create_namespaced_pod(NS, body)

        async def running() -> JSON | None:
            found = reflector.resources.get(f"{NS}/jupyter-alice")
            return found if found and found["status"].get("phase") == "Running" else None

        seen = await eventually(running, 30, "the reflector to see the pod Running")
        assert seen["spec"]["nodeName"] == "gpu-a100-0" and seen["spec"]["priority"] == 1000

        async def answers() -> bool:
            try:
                async with httpx.AsyncClient() as http:
                    r = await http.get(f"http://{seen['status']['podIP']}:{port}/")
                return r.status_code == 200
            except httpx.HTTPError:
                return False

        await eventually(answers, 30, "the notebook pod to answer HTTP")
        await client.CoreV1Api(api).delete_namespaced_pod("jupyter-alice", NS,
                                                           grace_period_seconds=1)

        async def removed() -> bool:
            return f"{NS}/jupyter-alice" not in reflector.resources and not kube.pids()

        await eventually(removed, 30, "the pod to disappear and its process to stop")
    finally:
        await reflector.stop()


async def test_kueue_admits_within_quota_and_queues_the_rest(
        kube: KubeCluster, api: client.ApiClient) -> None:
    """Two 2-GPU jobs against a 2-GPU quota: one runs, the other waits with Kueue's message
    and is admitted (onto the flavor's nodes) when the first finishes."""
    kube.create({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                 "metadata": {"name": "a100"},
                 "spec": {"nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}}})
    kube.create({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
                 "metadata": {"name": "gpus"},
                 "spec": {"namespaceSelector": {}, "resourceGroups": [{
                     "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                     "flavors": [{"name": "a100", "resources": [
                         {"name": "cpu", "nominalQuota": "16"},
                         {"name": "memory", "nominalQuota": "64Gi"},
                         {"name": "nvidia.com/gpu", "nominalQuota": "2"}]}]}]}})
    kube.create({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                 "metadata": {"name": "team"}, "spec": {"clusterQueue": "gpus"}})
    release = kube.data_dir / "release"
    code = ("import pathlib, time\n"
            f"while not pathlib.Path({str(release)!r}).exists():\n"
            "    time.sleep(0.05)\n")
    batch = client.BatchV1Api(api)
    for name in ("first", "second"):
        body = job_body(name, code, container={"resources": {
            "limits": {"nvidia.com/gpu": "2", "cpu": "1", "memory": "1Gi"}}})
        body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team"}
        created = await batch.create_namespaced_job(NS, request_body(body))
        assert created.spec.suspend is True  # the webhook suspends queued Jobs

    async def one_running() -> JSON | None:
        pods = [p for p in kube.objects("pods") if p["status"].get("phase") == "Running"]
        return pods[0] if len(pods) == 1 else None

    pod = await eventually(one_running, 30, "the first job's pod to run")
    assert pod["metadata"]["labels"]["job-name"] == "first"
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}

    async def second_pending() -> str | None:
        for w in kube.objects("workloads"):
            if w["spec"]["podSets"][0]["template"]["metadata"]["labels"]["job-name"] == \
                    "second":
                conds = (w.get("status") or {}).get("conditions") or []
                return next((c["message"] for c in conds if c["type"] == "QuotaReserved"
                             and c["status"] == "False"), None)
        return None

    message = await eventually(second_pending, 30, "the second workload to be pending")
    assert message == ("couldn't assign flavors to pod set main: insufficient quota for "
                       "nvidia.com/gpu in flavor a100, 2 more needed")
    assert present(kube.get("jobs", "second"))["spec"]["suspend"] is True
    release.write_text("go")
    for name in ("first", "second"):
        assert condition(await finished_job(kube, name), "Complete")


async def test_higher_priority_pod_preempts_lower_priority_one(
        kube: KubeCluster, api: client.ApiClient) -> None:
    for name, value in (("sweep-low", 100), ("notebook", 1000)):
        kube.create({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                     "metadata": {"name": name}, "value": value})
    core = client.CoreV1Api(api)

    def a100_pod(name: str, priority: str) -> JSON:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                "spec": {"restartPolicy": "Never", "priorityClassName": priority,
                         "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
                         "containers": [{"name": "m", "image": "x", "command": [
                             "python", "-c", "import time; time.sleep(600)"],
                             "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}

    await core.create_namespaced_pod(NS, request_body(a100_pod("low", "sweep-low")))

    async def low_running() -> int | None:
        return kube.pids().get("low", {}).get("m")

    low_pid = await eventually(low_running, 30, "the low-priority pod to run")
    watcher = watch.Watch()
    rv = (await core.list_namespaced_pod(NS)).metadata.resource_version
    await core.create_namespaced_pod(NS, request_body(a100_pod("high", "notebook")))
    deleted = None
    async for event in watcher.stream(core.list_namespaced_pod, NS, resource_version=rv,
                                      field_selector="metadata.name=low", timeout_seconds=30):
        if event["type"] == "DELETED":
            deleted = event["object"]
            break
    assert deleted is not None, "the low-priority pod was not preempted"
    reasons = {c.type: c.reason for c in deleted.status.conditions}
    assert reasons["DisruptionTarget"] == "PreemptionByScheduler"

    async def high_running() -> JSON | None:
        p = kube.get("pods", "high")
        return p if p and p["status"].get("phase") == "Running" and not alive(low_pid) else None

    assert (await eventually(high_running, 30, "the high-priority pod to run"))["spec"][
        "nodeName"] == "gpu-a100-0"


async def test_follow_log_and_on_failure_restarts(kube: KubeCluster,
                                                  api: client.ApiClient) -> None:
    """OnFailure restarts the container in place (counting toward backoffLimit); the log
    follows across restarts until the container finishes."""
    marker = kube.data_dir / "attempts"
    code = (f"import pathlib, sys; p = pathlib.Path({str(marker)!r}); "
            "n = len(p.read_text()) if p.exists() else 0; p.write_text('x' * (n + 1)); "
            "print('attempt', n + 1, flush=True); sys.exit(0 if n >= 1 else 1)")
    body = job_body("retry", code, pod={"restartPolicy": "OnFailure"})
    body["spec"]["backoffLimit"] = 2
    await client.BatchV1Api(api).create_namespaced_job(NS, request_body(body))
    job = await finished_job(kube, "retry")
    assert condition(job, "Complete"), job["status"]
    pod = kube.objects("pods", label_selector="job-name=retry")[0]
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 1
    log = await client.CoreV1Api(api).read_namespaced_pod_log(pod["metadata"]["name"], NS,
                                                              follow=True)
    assert log.splitlines() == ["attempt 1", "attempt 2"]


async def test_update_rules_dry_run_collection_delete_and_ttl(
        kube: KubeCluster, api: client.ApiClient) -> None:
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    with pytest.raises(ApiException) as err:
        await core.create_namespaced_secret(NS, request_body({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "s"},
            "data": {"k": "not base64!"}}))
    assert err.value.status == 422 and "data[k]" in api_status(err.value)["message"]
    dry = await batch.create_namespaced_job(NS, request_body(job_body("dry", "1")), dry_run="All")
    assert dry.metadata.name == "dry" and kube.objects("jobs") == []
    await batch.create_namespaced_job(NS, request_body(job_body("held", "1", suspend=True)))
    # scheduling directives of a suspended, never started Job may change (Kueue does this)
    await batch.patch_namespaced_job("held", NS, {"spec": {"template": {"spec": {
        "nodeSelector": {"nvidia.com/gpu.product": "Tesla-T4"}}}}})
    with pytest.raises(ApiException) as err:
        await batch.patch_namespaced_job("held", NS, {"spec": {"template": {"spec": {
            "containers": [{"name": "main", "image": "other", "command": ["true"]}]}}}})
    assert err.value.status == 422
    assert "spec.template" in api_status(err.value)["message"]
    job = await batch.read_namespaced_job("held", NS)  # read-modify-write keeps working
    job.metadata.labels["touched"] = "yes"
    await batch.replace_namespaced_job("held", NS, job)
    await batch.delete_collection_namespaced_job(NS, label_selector="touched=yes",
                                                 propagation_policy="Background")
    assert kube.objects("jobs") == []
    rv = (await batch.list_namespaced_job(NS)).metadata.resource_version
    await batch.create_namespaced_job(
        NS, request_body(job_body("brief", "1", ttlSecondsAfterFinished=0)))
    types = []
    async for event in watch.Watch().stream(batch.list_namespaced_job, NS, resource_version=rv,
                                            timeout_seconds=30):
        types.append(event["type"])
        if event["type"] == "DELETED":
            assert condition(api.sanitize_for_serialization(event["object"]), "Complete")
            break
    assert types[0] == "ADDED" and types[-1] == "DELETED"

    async def pods_gone() -> bool:
        return not kube.objects("pods")

    await eventually(pods_gone, 30, "the TTL-deleted Job's pods to be collected")


async def test_image_pull_errors_and_oom_kills_surface_like_a_cluster(
        kube: KubeCluster, api: client.ApiClient) -> None:
    kube.runtime.missing_images.add("registry.example/missing:1")
    core = client.CoreV1Api(api)
    await core.create_namespaced_pod(NS, request_body({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nopull"},
        "spec": {"restartPolicy": "Never", "containers": [
            {"name": "m", "image": "registry.example/missing:1", "command": ["true"]}]}}))

    async def pull_error() -> str | None:
        p = kube.get("pods", "nopull")
        waiting = [s["state"]["waiting"] for s in p["status"].get("containerStatuses") or []
                   if "waiting" in s["state"]] if p else []
        return waiting[0]["reason"] if p and waiting and p["status"]["phase"] == "Pending" \
            else None

    assert await eventually(pull_error, 30, "ErrImagePull") in ("ErrImagePull",
                                                                 "ImagePullBackOff")
    hog = job_body("hog", "x = b'x' * (300 * 1024 * 1024); import time; time.sleep(600)",
                   container={"resources": {"limits": {"memory": "64Mi"}}})
    await client.BatchV1Api(api).create_namespaced_job(NS, request_body(hog))
    job = await finished_job(kube, "hog")
    assert present(condition(job, "Failed"))["reason"] == "BackoffLimitExceeded"
    pod = kube.objects("pods", label_selector="job-name=hog")[0]
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["reason"], terminated["exitCode"]) == ("OOMKilled", 137)


async def test_pod_failure_policy_ignores_preemption_and_fails_fast_on_exit_code(
        kube: KubeCluster, api: client.ApiClient) -> None:
    for name, value in (("sweep-low", 100), ("notebook", 1000)):
        kube.create({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                     "metadata": {"name": name}, "value": value})
    marker = kube.data_dir / "first-attempt"
    code = (f"import pathlib, time; p = pathlib.Path({str(marker)!r})\n"
            "if not p.exists():\n    p.write_text('1'); time.sleep(600)\n")
    gpus = {"resources": {"limits": {"nvidia.com/gpu": "2"}}}
    a100 = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    policy = {"rules": [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
        {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]}
    batch = client.BatchV1Api(api)
    await batch.create_namespaced_job(NS, request_body(job_body(
        "low", code, container=gpus, podFailurePolicy=policy,
        pod={"priorityClassName": "sweep-low", "nodeSelector": a100})))

    async def started() -> bool:
        return marker.exists()

    await eventually(started, 30, "the low-priority job to start")
    await batch.create_namespaced_job(NS, request_body(job_body(
        "high", "pass", container=gpus, pod={"priorityClassName": "notebook",
                                             "nodeSelector": a100})))
    for name in ("high", "low"):
        job = await finished_job(kube, name)
        assert condition(job, "Complete"), (name, job["status"])
    assert "failed" not in present(kube.get("jobs", "low"))["status"]  # the preemption was ignored
    fail = job_body("crash", "import sys; sys.exit(42)", podFailurePolicy=policy)
    fail["spec"]["backoffLimit"] = 5
    await batch.create_namespaced_job(NS, request_body(fail))
    failed = present(condition(await finished_job(kube, "crash"), "Failed"))
    assert failed["reason"] == "PodFailurePolicy"
    assert "failed with exit code 42 matching FailJob rule at index 1" in failed["message"]


def test_standalone_cluster_serves_until_terminated(tmp_path: Path) -> None:
    """``python -m kubesim --data DIR`` (what the benchmark runs): prints its URL and
    kubeconfig, serves the API and the counters, and exits cleanly on SIGTERM."""
    import signal
    import subprocess
    import sys

    import httpx

    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-m", "kubesim", "--data", str(tmp_path / "d"),
                             "--workdir", str(tmp_path / "w")], cwd=repo,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())  # blocks until the cluster is up
        assert Path(info["kubeconfig"]).read_text().count(info["url"]) == 1
        assert (tmp_path / "d").is_dir() and info["namespace"] == "tunehub"
        # Like an API server: no token is system:anonymous (403), a wrong one 401.
        anonymous = httpx.get(f"{info['url']}/api/v1/nodes", timeout=10)
        assert anonymous.status_code == 403, anonymous.text
        assert anonymous.json()["message"] == (
            'nodes is forbidden: User "system:anonymous" cannot list resource "nodes" in API '
            'group "" at the cluster scope')
        bad = httpx.get(f"{info['url']}/api/v1/nodes", timeout=10,
                        headers={"Authorization": "Bearer nope"})
        assert bad.status_code == 401 and bad.json()["reason"] == "Unauthorized"
        nodes = httpx.get(f"{info['url']}/api/v1/nodes", timeout=10, headers={
            "Authorization": f"Bearer {info['token']}"}).json()["items"]
        assert {n["metadata"]["name"] for n in nodes} == {"gpu-a100-0", "gpu-t4-0", "cpu-0"}
        counters = httpx.get(info["counters"], timeout=10).json()
        assert counters["client"] == {"nodes": {"list": 1}}
        assert counters["harness"]["nodes"]["create"] == 3
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


async def test_secret_configmap_and_downward_api_volumes(
        kube: KubeCluster, api: client.ApiClient, tmp_path: Path) -> None:
    core = client.CoreV1Api(api)
    await core.create_namespaced_secret(NS, request_body({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "trial-token"},
        "stringData": {"token": "t0k"}}))
    await core.create_namespaced_config_map(NS, request_body({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "cfg"},
        "data": {"a.yaml": "x: 1", "b": "2"}}))
    secret_dir, cfg_dir, info_dir = (tmp_path / n for n in ("secret", "cfg", "info"))
    out = kube.data_dir / "seen"
    code = ("import pathlib; r = lambda p: pathlib.Path(p).read_text(); "
            f"pathlib.Path({str(out)!r}).write_text(' '.join(["
            f"r({str(secret_dir / 'token')!r}), r({str(cfg_dir / 'conf.yaml')!r}), "
            f"r({str(info_dir / 'labels')!r})]))")
    mounts = [{"name": "s", "mountPath": str(secret_dir), "readOnly": True},
              {"name": "c", "mountPath": str(cfg_dir)},
              {"name": "i", "mountPath": str(info_dir)}]
    volumes = [{"name": "s", "secret": {"secretName": "trial-token"}},
               {"name": "c", "configMap": {"name": "cfg",
                                           "items": [{"key": "a.yaml", "path": "conf.yaml"}]}},
               {"name": "i", "downwardAPI": {"items": [
                   {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels['job-name']"}}]}}]
    await client.BatchV1Api(api).create_namespaced_job(NS, request_body(job_body(
        "vols", code, container={"volumeMounts": mounts}, pod={"volumes": volumes})))
    assert condition(await finished_job(kube, "vols"), "Complete")
    assert out.read_text() == "t0k x: 1 vols"
    assert not secret_dir.exists()  # removed with the pod's end, like a tmpfs unmount
    taken = tmp_path / "taken"
    taken.mkdir()
    await core.create_namespaced_pod(NS, request_body({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "clash"},
        "spec": {"restartPolicy": "Never", "volumes": [volumes[0]], "containers": [
            {"name": "m", "image": "x", "command": ["true"],
             "volumeMounts": [{"name": "s", "mountPath": str(taken)}]}]}}))

    async def failed() -> JSON | None:
        p = kube.get("pods", "clash")
        return p if p and p["status"].get("phase") == "Failed" else None

    message = (await eventually(failed, 30, "the clashing pod to fail"))["status"]["message"]
    assert f"mountPath {taken} already exists" in message


async def test_scheduler_follows_node_objects_cordon_and_taints(
        kube: KubeCluster, api: client.ApiClient) -> None:
    """The scheduler reads Node objects, so tainting or cordoning through the API counts."""
    core = client.CoreV1Api(api)
    await core.patch_node("gpu-t4-0", {"spec": {"unschedulable": True}})
    await core.patch_node("gpu-a100-0", {"spec": {"taints": [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}})
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpu1"},
           "spec": {"restartPolicy": "Never", "containers": [
               {"name": "m", "image": "x", "command": ["python", "-c", "1"],
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    await core.create_namespaced_pod(NS, request_body(pod))

    async def message() -> str | None:
        p = kube.get("pods", "gpu1")
        conds = [c for c in p["status"].get("conditions") or [] if c.get("reason")] if p else []
        return conds[0]["message"] if conds else None

    assert await eventually(message, 30, "the unschedulable message") == (
        "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) had untolerated "
        "taint {nvidia.com/gpu: present}, 1 node(s) were unschedulable.")
    await core.patch_node("gpu-t4-0", {"spec": {"unschedulable": None}})

    async def ran_on_t4() -> bool:
        p = present(kube.get("pods", "gpu1"))
        return p["status"].get("phase") == "Succeeded" and p["spec"]["nodeName"] == "gpu-t4-0"

    await eventually(ran_on_t4, 30, "the pod to run on the uncordoned T4 node")


HUB_CONFIG = '''
import os
c = get_config()  # noqa: F821
c.JupyterHub.spawner_class = "kubespawner.KubeSpawner"
c.JupyterHub.authenticator_class = "dummy"
c.JupyterHub.bind_url = os.environ["T_HUB_URL"]
c.JupyterHub.hub_bind_url = os.environ["T_HUB_API_URL"]
c.ConfigurableHTTPProxy.api_url = os.environ["T_PROXY_API_URL"]
c.JupyterHub.db_url = os.environ["T_DB_URL"]
c.JupyterHub.cookie_secret = bytes.fromhex("00" * 32)
c.JupyterHub.services = [{"name": "driver", "api_token": os.environ["T_TOKEN"]}]
c.JupyterHub.load_roles = [{"name": "driver", "services": ["driver"],
                            "scopes": ["admin:users", "admin:servers", "access:servers"]}]
c.KubeSpawner.namespace = "tunehub"
c.KubeSpawner.cmd = ["jupyterhub-singleuser"]
c.KubeSpawner.args = ["--allow-root"]  # the harness runs pods as the test's user
c.KubeSpawner.port = int(os.environ["T_NB_PORT"])
c.KubeSpawner.image = "tunehub/notebook:latest"
c.KubeSpawner.start_timeout = 120
c.KubeSpawner.http_timeout = 120
'''


@pytest.mark.timeout(300)
def test_real_jupyterhub_with_kubespawner_spawns_a_reachable_notebook_pod(
        kube: KubeCluster, tmp_path: Path) -> None:
    """JupyterHub + KubeSpawner + configurable-http-proxy against the emulator: the notebook
    "pod" starts, is reachable through the proxy, and stopping it removes pod and process."""
    import subprocess
    import sys

    import httpx

    from tests.polling import wait_for
    from tests.service_fixtures import free_port

    hub, token = f"http://127.0.0.1:{free_port()}", "driver-token-0123456789"
    (tmp_path / "hub_config.py").write_text(HUB_CONFIG)
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig), "T_HUB_URL": hub,
           "T_HUB_API_URL": f"http://127.0.0.1:{free_port()}", "T_TOKEN": token,
           "T_PROXY_API_URL": f"http://127.0.0.1:{free_port()}",
           "T_DB_URL": f"sqlite:///{tmp_path / 'hub.sqlite'}", "T_NB_PORT": str(free_port()),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    log = (tmp_path / "hub.log").open("w")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "jupyterhub"), "-f",
                             str(tmp_path / "hub_config.py")], cwd=tmp_path, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    auth = {"Authorization": f"token {token}"}

    def up() -> bool:
        try:
            return httpx.get(f"{hub}/hub/api/", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def server() -> JSON | None:
        return httpx.get(f"{hub}/hub/api/users/alice", headers=auth, timeout=10).json()[
            "servers"].get("")

    try:
        wait_for(up, 60, "the hub to answer")
        assert httpx.post(f"{hub}/hub/api/users/alice", headers=auth).status_code == 201
        httpx.post(f"{hub}/hub/api/users/alice/server", headers=auth, timeout=60)
        wait_for(lambda: (server() or {}).get("ready"), 120, "the notebook to be ready")
        pod = kube.get("pods", "jupyter-alice")
        assert pod is not None and pod["status"]["phase"] == "Running"
        status = httpx.get(f"{hub}/user/alice/api/status", headers=auth, timeout=30)
        assert status.status_code == 200 and "kernels" in status.json()
        httpx.delete(f"{hub}/hub/api/users/alice/server", headers=auth, timeout=60)
        wait_for(lambda: server() is None and kube.get("pods", "jupyter-alice") is None
                 and not kube.pids(), 60, "the server, pod and process to be gone")
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


async def test_work_queue_job_without_completions(kube: KubeCluster,
                                                  api: client.ApiClient) -> None:
    """parallelism without completions: both workers run, the Job completes when they end."""
    body = job_body("queue", "print('worked')", parallelism=2)
    created = await client.BatchV1Api(api).create_namespaced_job(NS, request_body(body))
    assert created.spec.completions is None and created.spec.parallelism == 2
    job = await finished_job(kube, "queue")
    assert condition(job, "Complete") and job["status"]["succeeded"] == 2
    assert len(kube.objects("pods", label_selector="job-name=queue")) == 2


async def test_kueue_preempts_lower_priority_workload_and_readmits_it(
        kube: KubeCluster, api: client.ApiClient) -> None:
    for name, value in (("sweep-low", 100), ("sweep-high", 1000)):
        kube.create({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                     "metadata": {"name": name}, "value": value})
    kube.create({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                 "metadata": {"name": "t4"},
                 "spec": {"nodeLabels": {"nvidia.com/gpu.product": "Tesla-T4"}}})
    kube.create({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
                 "metadata": {"name": "gpus"},
                 "spec": {"preemption": {"withinClusterQueue": "LowerPriority"},
                          "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"],
                                              "flavors": [{"name": "t4", "resources": [
                                                  {"name": "nvidia.com/gpu",
                                                   "nominalQuota": "2"}]}]}]}})
    kube.create({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                 "metadata": {"name": "team"}, "spec": {"clusterQueue": "gpus"}})
    marker = kube.data_dir / "low-started"
    low_code = (f"import pathlib, time; p = pathlib.Path({str(marker)!r})\n"
                "if not p.exists():\n    p.write_text('1'); time.sleep(600)\n")
    batch = client.BatchV1Api(api)

    def queued(name: str, code: str, priority: str) -> JSON:
        body = job_body(name, code, pod={"priorityClassName": priority}, container={
            "resources": {"limits": {"nvidia.com/gpu": "2"}}})
        body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team"}
        return body

    await batch.create_namespaced_job(NS, request_body(queued("low", low_code, "sweep-low")))

    async def low_started() -> bool:
        return marker.exists()

    await eventually(low_started, 30, "the low-priority job to run")
    rv = (await batch.list_namespaced_job(NS)).metadata.resource_version
    await batch.create_namespaced_job(NS, request_body(queued("high", "pass", "sweep-high")))
    assert condition(await finished_job(kube, "high"), "Complete")
    low = await finished_job(kube, "low")  # re-admitted after the high one finished
    suspends = []  # the low Job's history, replayed from before the high one arrived
    async for event in watch.Watch().stream(batch.list_namespaced_job, NS, resource_version=rv,
                                            field_selector="metadata.name=low",
                                            timeout_seconds=1):
        suspends.append(event["object"].spec.suspend)
    assert suspends[0] is True and suspends[-1] is False  # evicted, then re-admitted
    assert condition(low, "Complete") and "failed" not in low["status"]
