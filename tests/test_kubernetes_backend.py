"""The Kubernetes backend: its manifests against the Kubernetes OpenAPI schema, and the backend
against the API emulator + kubelet stand-in (kubesim), whose pods run as local processes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import kubernetes_validate
import pytest

from kubesim import KubeCluster
from kubesim.rbac import grant
from kubesim.waiting import eventually
from tests.chart_security import TUNER_ACCOUNT, install_chart_security, tuner_kubeconfig
from tunehub_base.gpu_names import GpuNames
from tuner.backends._base import TrialEvent, TrialLaunch
from tuner.backends.kubernetes import GpuType, KubernetesBackend, KubeSettings
from tuner.backends.kubernetes import manifests as m
from tuner.sdk.training import ENV_TOKEN
from tuner.spec import Resources, SpecError, SweepSpec

K8S_VERSION = "1.30"
GPU_TYPES = [
    {"name": "t4", "product": "Tesla-T4", "generation": 1, "maxPerNode": 4},
    {"name": "a100", "product": "NVIDIA-A100-SXM4-80GB", "generation": 2, "maxPerNode": 2},
]


#: What a pod needs to pass Pod Security ``restricted`` (the namespace's level here).
RESTRICTED_POD = {"runAsNonRoot": True, "runAsUser": 1000,
                  "seccompProfile": {"type": "RuntimeDefault"}}
RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def settings(data: Path, **kw: object) -> KubeSettings:
    base: dict = {
        "namespace": "tunehub",
        "data_path": data,
        "gpu_types": (
            GpuType("t4", "Tesla-T4", 1, 4),
            GpuType("a100", "NVIDIA-A100-SXM4-80GB", 2, 2),
        ),
    }
    base.update(kw)
    return KubeSettings(**base)


def launch(data: Path, trial: int = 7, attempt: int = 1, command: str = "python train.py",
           resources: Resources | None = None, **kw: object) -> TrialLaunch:
    workdir = data / ".tunehub" / "sweeps" / "3" / "trials" / str(trial)
    base: dict = {
        "sweep_id": 3, "trial_id": trial, "number": trial, "attempt": attempt,
        "command": command, "workdir": workdir,
        "env": {ENV_TOKEN: "s3cret", "TUNEHUB_TRIAL_ID": str(trial), "TUNEHUB_DATA": str(data)},
        "resources": resources or Resources(), "timeout": 90.0,
        "log_path": workdir / "trial.log", "priority": "normal", "owner": "alice",
    }
    base.update(kw)
    return TrialLaunch(**base)


def valid(obj: dict) -> dict:
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    return obj


# --- manifests (unit) ----------------------------------------------------------------------

def test_job_manifest_is_valid_and_locked_down(tmp_path: Path) -> None:
    s = settings(tmp_path)
    job = valid(m.job(s, launch(tmp_path, resources=Resources(cpu=0.5, memory="1Gi"))))
    meta, spec = job["metadata"], job["spec"]
    assert meta["name"] == "tunehub-s3-t7-a1"
    for key in ("name", "instance", "component", "part-of", "managed-by"):
        assert f"app.kubernetes.io/{key}" in meta["labels"]
    assert meta["labels"][m.SWEEP_LABEL] == "3" and meta["labels"][m.TRIAL_LABEL] == "7"
    assert meta["labels"][m.ATTEMPT_LABEL] == "1"
    assert spec["backoffLimit"] == 0 and spec["activeDeadlineSeconds"] == 90
    assert spec["ttlSecondsAfterFinished"] == 3600 and "suspend" not in spec
    pod = spec["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["priorityClassName"] == "tunehub-sweep-normal"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 1000
    (ctr,) = pod["containers"]
    sc = ctr["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert ctr["resources"] == {
        "requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "500m", "memory": "1Gi"}}
    env = {e["name"]: e for e in ctr["env"]}
    assert "value" not in env[ENV_TOKEN]  # never in the Job, only in the Secret
    assert env[ENV_TOKEN]["valueFrom"]["secretKeyRef"] == {
        "name": "tunehub-s3-t7-a1-token", "key": "token"}
    assert "s3cret" not in json.dumps(job)
    # Only the shared datasets and its sweep's code (read-only) and its own directory: not
    # the whole volume, which holds tunehub's home (everyone's sweeps), the registry and other
    # users' areas, nor its sweep's directory, whose parts the tuner reads.
    assert ctr["volumeMounts"] == [
        {"name": "data", "mountPath": str(tmp_path / "datasets"), "subPath": "datasets",
         "readOnly": True},
        {"name": "data", "mountPath": str(tmp_path / ".tunehub/sweeps/3/code"),
         "subPath": ".tunehub/sweeps/3/code", "readOnly": True},
        {"name": "data", "mountPath": str(tmp_path / ".tunehub/sweeps/3/trials/7"),
         "subPath": ".tunehub/sweeps/3/trials/7"},
    ]
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "none"  # a CPU trial sees no GPU
    assert pod["volumes"] == [{"name": "data", "persistentVolumeClaim": {
        "claimName": "tunehub-data"}}]
    assert "tolerations" not in pod and "nodeSelector" not in pod and "affinity" not in pod


def test_gpu_type_selects_nodes_and_tolerates_the_gpu_taint(tmp_path: Path) -> None:
    job = valid(m.job(settings(tmp_path), launch(
        tmp_path, resources=Resources(gpu=2, gpu_type="a100"))))
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    # The device plugin decides which GPUs it sees; tunehub does not hide them.
    names = {e["name"] for e in pod["containers"][0]["env"]}
    assert not names & {"NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"}


@pytest.mark.parametrize(("priority", "preferred"), [
    ("low", "Tesla-T4"), ("high", "NVIDIA-A100-SXM4-80GB")])
def test_priority_orders_gpu_generations(tmp_path: Path, priority: str, preferred: str) -> None:
    job = valid(m.job(settings(tmp_path), launch(
        tmp_path, resources=Resources(gpu=1), priority=priority)))
    pod = job["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == f"tunehub-sweep-{priority}"
    terms = pod["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    best = max(terms, key=lambda t: t["weight"])
    assert best["preference"]["matchExpressions"][0]["values"] == [preferred]
    normal = m.job(settings(tmp_path), launch(tmp_path, resources=Resources(gpu=1)))
    assert "affinity" not in normal["spec"]["template"]["spec"]


def test_kueue_queue_suspends_and_labels(tmp_path: Path) -> None:
    job = valid(m.job(settings(tmp_path, queue="team-a"), launch(tmp_path)))
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"


def test_multi_worker_is_an_indexed_job_with_a_headless_service(tmp_path: Path) -> None:
    s = settings(tmp_path)
    job = valid(m.job(s, launch(tmp_path, resources=Resources(workers=3))))
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 3
    assert spec["template"]["spec"]["subdomain"] == "tunehub-s3-t7-a1"
    job["metadata"]["uid"] = "0e0e0e0e-0000-0000-0000-000000000000"
    svc = valid(m.worker_service(s, launch(tmp_path), job))
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    secret = valid(m.token_secret(s, launch(tmp_path), "tok", job))
    assert secret["stringData"] == {"token": "tok"}
    assert secret["metadata"]["ownerReferences"][0]["kind"] == "Job"


def test_tf_config_per_worker_index(tmp_path: Path) -> None:
    """The wrapper really computes TF_CONFIG from JOB_COMPLETION_INDEX in a shell."""
    import subprocess

    line = m.tf_config_command("j", 2, "echo \"$TF_CONFIG\"")
    out = subprocess.run(["/bin/sh", "-c", line], env={"JOB_COMPLETION_INDEX": "1"},
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == {
        "cluster": {"worker": ["j-0.j:2222", "j-1.j:2222"]},
        "task": {"type": "worker", "index": 1}}


def test_workdir_outside_the_data_store_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="outside the data store"):
        m.job(settings(tmp_path / "data"), launch(tmp_path / "elsewhere"))


def test_settings_from_env(tmp_path: Path) -> None:
    gpu_file = tmp_path / "gpus.yaml"
    gpu_file.write_text("gpuTypes:\n  - {name: t4, product: Tesla-T4, generation: 1}\n")
    s = KubeSettings.from_env({
        "TUNEHUB_DATA": str(tmp_path), "TUNEHUB_K8S_NAMESPACE": "ml",
        "TUNEHUB_K8S_GPU_TYPES": str(gpu_file), "TUNEHUB_K8S_QUEUE": "q",
        "TUNEHUB_K8S_PRIORITY_CLASSES": json.dumps({"low": "cheap"}),
        "TUNEHUB_K8S_MAX_GPUS_PER_USER": "4", "TUNEHUB_K8S_TRIAL_TIMEOUT": "2h",
        "TUNEHUB_K8S_IMAGE_PULL_SECRETS": json.dumps([{"name": "reg"}]),
    })
    assert s.namespace == "ml" and s.gpu_types == (GpuType("t4", "Tesla-T4", 1, None),)
    assert s.priority_classes["low"] == "cheap" and s.priority_classes["high"] == (
        "tunehub-sweep-high")
    assert s.max_gpus_per_user == 4 and s.default_timeout == 7200
    assert s.image_pull_secrets == ("reg",) and s.queue == "q"
    with pytest.raises(SpecError, match="TUNEHUB_K8S_MAX_GPUS_PER_USER"):
        KubeSettings.from_env({"TUNEHUB_K8S_MAX_GPUS_PER_USER": "many"})
    with pytest.raises(SpecError, match=r"TUNEHUB_K8S_GPU_TYPES\[0\]"):
        KubeSettings.from_env({"TUNEHUB_K8S_GPU_TYPES": '[{"name": "x"}]'})


# --- against the emulated cluster ----------------------------------------------------------

@pytest.fixture
def kube_env(kube: KubeCluster, monkeypatch: pytest.MonkeyPatch) -> KubeCluster:
    """The environment a tuner gets from the chart, pointed at the emulated cluster: the
    chart's tuner ServiceAccount and Role, a namespace enforcing Pod Security ``restricted``."""
    data = kube.data_dir
    install_chart_security(kube)
    monkeypatch.setenv("KUBECONFIG", str(tuner_kubeconfig(kube)))
    monkeypatch.setenv("TUNEHUB_DATA", str(data))
    monkeypatch.setenv("TUNEHUB_HOME", str(data / ".tunehub"))
    monkeypatch.setenv("TUNEHUB_K8S_GPU_TYPES", json.dumps(GPU_TYPES))
    monkeypatch.setenv("TUNEHUB_K8S_UNSCHEDULABLE_TIMEOUT", "0")
    for value, priority in ((10, "low"), (100, "normal"), (500, "high")):
        kube.create({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                     "metadata": {"name": f"tunehub-sweep-{priority}"}, "value": value})
    return kube


class Events:
    """The backend's events, awaited with a deadline."""

    def __init__(self) -> None:
        self.seen: list[TrialEvent] = []
        self.changed = asyncio.Event()

    def __call__(self, event: TrialEvent) -> None:
        self.seen.append(event)
        self.changed.set()

    async def final(self, trial: int, timeout: float = 60) -> TrialEvent:
        """The first succeeded/failed event of ``trial``."""
        async def find() -> TrialEvent:
            while True:
                for ev in self.seen:
                    if ev.trial_id == trial and ev.final:
                        return ev
                self.changed.clear()
                await self.changed.wait()
        return await asyncio.wait_for(find(), timeout)


@pytest.fixture
async def backend(kube_env: KubeCluster) -> AsyncIterator[tuple[KubernetesBackend, Events]]:
    be = KubernetesBackend.from_env()
    events = Events()
    be.subscribe(events)
    await be.start()
    try:
        yield be, events
    finally:
        await be.close()


def kube_launch(kube: KubeCluster, trial: int, script: str, **kw: object) -> TrialLaunch:
    kw.setdefault("command", f"python -c {json.dumps(script)}")
    la = launch(kube.data_dir, trial=trial, **kw)
    la.workdir.mkdir(parents=True, exist_ok=True)
    return la


async def test_trial_job_runs_and_succeeds(
        backend: tuple[KubernetesBackend, Events], kube_env: KubeCluster) -> None:
    be, events = backend
    script = ("import os; print('token', os.environ['TUNEHUB_TRIAL_TOKEN'], 'cwd', os.getcwd());"
              "open('artifact.txt', 'w').write('ok')")
    la = kube_launch(kube_env, 1, script)
    await be.launch(la)
    done = await events.final(1)
    assert done.kind == "succeeded" and done.attempt == 1, done
    assert "started" in [e.kind for e in events.seen]
    log = la.log_path.read_text()
    assert f"token s3cret cwd {la.workdir}" in log  # the Secret reached the env, once
    assert (la.workdir / "artifact.txt").read_text() == "ok"
    job = kube_env.get("jobs", "tunehub-s3-t1-a1")
    assert job is not None and job["spec"]["backoffLimit"] == 0
    secret = kube_env.get("secrets", "tunehub-s3-t1-a1-token")
    assert secret is not None and secret["metadata"]["ownerReferences"][0]["name"] == (
        "tunehub-s3-t1-a1")
    counts = kube_env.counters.snapshot()
    # The Job, its Secret and its NetworkPolicy (its network island), nothing else.
    assert kube_env.counters.writes() == 3, counts
    assert counts[("create", "jobs")] == counts[("create", "secrets")] == 1
    assert counts[("create", "networkpolicies")] == 1
    await be.cleanup(3)
    await eventually(_gone(kube_env, "jobs", "tunehub-s3-t1-a1"), 30, "the Job to be deleted")


def _gone(kube: KubeCluster, plural: str, name: str):  # noqa: ANN202
    async def check() -> bool:
        return kube.get(plural, name) is None
    return check


async def test_failure_reasons_are_readable(
        backend: tuple[KubernetesBackend, Events], kube_env: KubeCluster) -> None:
    be, events = backend
    await be.launch(kube_launch(kube_env, 1, "import sys; print('boom'); sys.exit(3)"))
    failed = await events.final(1)
    assert failed.kind == "failed" and "exited with code 3" in failed.reason, failed

    oom = "x = bytearray(300 * 2**20); import time; time.sleep(30)"
    await be.launch(kube_launch(kube_env, 2, oom, resources=Resources(memory="64Mi")))
    failed = await events.final(2)
    assert failed.kind == "failed" and failed.reason.startswith("OOMKilled"), failed
    assert "64Mi" in failed.reason

    kube_env.runtime.missing_images.add("tunehub/trial:0.1.0")
    await be.launch(kube_launch(kube_env, 3, "print(1)"))
    failed = await events.final(3)
    assert "image pull failed" in failed.reason and "tunehub/trial:0.1.0" in failed.reason
    await eventually(_gone(kube_env, "jobs", "tunehub-s3-t3-a1"), 30, "the Job to be deleted")
    kube_env.runtime.missing_images.clear()

    await be.launch(kube_launch(kube_env, 4, "print(1)", resources=Resources(
        gpu=2, gpu_type="t4", cpu=1000)))
    failed = await events.final(4)
    assert failed.reason.startswith("unschedulable: 0/3 nodes are available"), failed

    await be.launch(kube_launch(kube_env, 5, "import time; time.sleep(60)", timeout=1.0))
    failed = await events.final(5)
    assert "timed out after 1s" in failed.reason and "DeadlineExceeded" in failed.reason


async def test_cancel_deletes_the_job_and_its_pods(
        backend: tuple[KubernetesBackend, Events], kube_env: KubeCluster) -> None:
    be, events = backend
    await be.launch(kube_launch(kube_env, 1, "import time; time.sleep(120)"))

    async def running() -> bool:
        pods = kube_env.objects("pods", label_selector=f"{m.TRIAL_LABEL}=1")
        return bool(pods) and pods[0]["status"].get("phase") == "Running"

    await eventually(running, 30, "the trial pod to run")
    await be.cancel(1, 1)
    failed = await events.final(1)
    assert failed.kind == "failed" and failed.reason == "cancelled"

    async def all_gone() -> bool:
        return not kube_env.objects("jobs") and not kube_env.objects(
            "pods", label_selector=f"{m.TRIAL_LABEL}=1")

    await eventually(all_gone, 30, "the Job and its pods to be deleted")
    assert kube_env.counters.writes(resource="jobs") == 2  # create, delete


async def test_reconcile_adopts_a_running_job_and_never_duplicates(
        kube_env: KubeCluster) -> None:
    first = KubernetesBackend.from_env()
    await first.start()
    marker = kube_env.data_dir / "go"
    la = kube_launch(kube_env, 1, "", command="python wait.py")
    (la.workdir / "wait.py").write_text(
        f"import os, time\nwhile not os.path.exists({str(marker)!r}):\n    time.sleep(0.1)\n"
        "print('adopted run done')\n")
    stale = kube_launch(kube_env, 2, "import time; time.sleep(120)")
    await first.launch(la)
    await first.launch(stale)
    await first.close()  # the tuner dies; its Jobs keep running

    second = KubernetesBackend.from_env()
    events = Events()
    second.subscribe(events)
    await second.start()
    try:
        # Trial 2's controller already moved on to attempt 2: attempt 1 is not adopted.
        adopted = await second.reconcile(3, [la, TrialLaunch(**{
            **stale.__dict__, "attempt": 2})])
        assert adopted == {(1, 1)}
        await eventually(_gone(kube_env, "jobs", "tunehub-s3-t2-a1"), 30,
                         "the unadopted Job to be deleted")
        await second.launch(la)  # a retried create of the same attempt: 409, adopted
        assert len(kube_env.objects("jobs", label_selector=f"{m.TRIAL_LABEL}=1")) == 1
        marker.write_text("")
        done = await events.final(1)
        assert done.kind == "succeeded" and done.attempt == 1
        assert "adopted run done" in la.log_path.read_text()
        pods = kube_env.objects("pods", label_selector=f"{m.TRIAL_LABEL}=1")
        assert len(pods) == 1  # it ran once
    finally:
        await second.close()


def spec(**resources: object) -> SweepSpec:
    return SweepSpec.from_dict({
        "name": "k", "command": "python train.py", "metric": "score",
        "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
        "resources": resources or {"cpu": 1}})


def test_check_refuses_what_cannot_run(kube_env: KubeCluster,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the chart's Role the tuner may not read Nodes or PriorityClasses: the GPU check
    uses the gpuTypes inventory. Granted cluster-wide reads, it uses the real ones."""
    with pytest.raises(SpecError, match=r"no node has more than 4 \(maxPerNode in "
                                        r"TUNEHUB_K8S_GPU_TYPES\)"):
        KubernetesBackend.from_env().check(spec(gpu=5))
    kube_env.apply(grant("cluster-reader", [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]},
        {"apiGroups": ["scheduling.k8s.io"], "resources": ["priorityclasses"], "verbs": ["get"]},
    ], [{"kind": "ServiceAccount", "name": TUNER_ACCOUNT, "namespace": kube_env.namespace}],
        cluster=True))
    be = KubernetesBackend.from_env()
    be.check(spec(gpu=2, gpu_type="a100"))
    be.check(spec(gpu=4))
    with pytest.raises(SpecError, match="no node has more than 4 .allocatable") as err:
        be.check(spec(gpu=5))
    assert err.value.field == "resources.gpu"
    with pytest.raises(SpecError, match="no a100 node has more than 2"):
        be.check(spec(gpu=3, gpu_type="a100"))
    with pytest.raises(SpecError, match="unknown GPU type 'h100'.*t4, a100") as err:
        be.check(spec(gpu=1, gpu_type="h100"))
    assert err.value.field == "resources.gpu_type"
    monkeypatch.setenv("TUNEHUB_K8S_PRIORITY_CLASSES", json.dumps({"normal": "missing"}))
    with pytest.raises(SpecError, match="PriorityClass 'missing'") as err:
        KubernetesBackend.from_env().check(spec(cpu=1))
    assert err.value.field == "priority"
    assert kube_env.objects("jobs") == [] and kube_env.objects("secrets") == []


async def test_multi_worker_trial_through_kueue_starts_as_a_gang(
        kube_env: KubeCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two 1-GPU workers queued in Kueue: the Job starts suspended, is admitted whole, and
    each worker gets TF_CONFIG for its own index."""
    kube_env.create({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                     "metadata": {"name": "t4"},
                     "spec": {"nodeLabels": {"nvidia.com/gpu.product": "Tesla-T4"}}})
    kube_env.create({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
                     "metadata": {"name": "gpus"},
                     "spec": {"namespaceSelector": {}, "resourceGroups": [{
                         "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                         "flavors": [{"name": "t4", "resources": [
                             {"name": "cpu", "nominalQuota": "8"},
                             {"name": "memory", "nominalQuota": "16Gi"},
                             {"name": "nvidia.com/gpu", "nominalQuota": "2"}]}]}]}})
    kube_env.create({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                     "metadata": {"name": "team"}, "spec": {"clusterQueue": "gpus"}})
    monkeypatch.setenv("TUNEHUB_K8S_QUEUE", "team")
    be = KubernetesBackend.from_env()
    events = Events()
    be.subscribe(events)
    await be.start()
    try:
        la = kube_launch(kube_env, 1, "import os; print('TF_CONFIG=' + os.environ['TF_CONFIG'])",
                         resources=Resources(gpu=1, workers=2, memory="1Gi"))
        await be.launch(la)
        job = kube_env.get("jobs", "tunehub-s3-t1-a1")
        assert job is not None and job["spec"]["completionMode"] == "Indexed"
        assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team"
        assert kube_env.get("services", "tunehub-s3-t1-a1") is not None
        done = await events.final(1)
        assert done.kind == "succeeded", done
        log = la.log_path.read_text()
        configs = [json.loads(line.split("=", 1)[1]) for line in log.splitlines()
                   if line.startswith("TF_CONFIG=")]
        assert sorted(c["task"]["index"] for c in configs) == [0, 1]
        pods = kube_env.objects("pods", label_selector=f"{m.TRIAL_LABEL}=1")
        assert {p["spec"]["nodeName"] for p in pods} == {"gpu-t4-0"}
        # The Service's per-pod names (job-i.job:2222), as the emulated pod network resolves
        # them for the pods' processes: each pod's own address (kubesim.podnet).
        assert configs[0]["cluster"] == configs[1]["cluster"]
        ips = {h.rsplit(":", 1)[0] for h in configs[0]["cluster"]["worker"]}
        assert ips == {p["status"]["podIP"] for p in pods} and len(ips) == 2
    finally:
        await be.close()


# Worker 1 fails at once; the chief would wait forever for its peer.
WORKER_FAILS = ("import os, sys, time; "
                "sys.exit(3) if os.environ['JOB_COMPLETION_INDEX'] == '1' else time.sleep(600)")


async def test_a_failing_worker_pod_fails_the_trial_and_stops_the_chief(
        backend: tuple[KubernetesBackend, Events], kube_env: KubeCluster) -> None:
    """The Indexed Job's ``backoffLimit: 0``: worker 1's failure fails the Job at once, the
    chief's pod is deleted and its process stopped, the trial fails with worker 1's reason."""
    be, events = backend
    await be.launch(kube_launch(kube_env, 1, WORKER_FAILS,
                                resources=Resources(workers=2, memory="256Mi")))
    failed = await events.final(1, timeout=120)
    assert failed.kind == "failed" and "exited with code 3" in failed.reason, failed

    async def chief_stopped() -> bool:
        return not any(name.startswith("tunehub-s3-t1-a1-0-") and procs
                       for name, procs in kube_env.kubelet.process_ids().items())
    await eventually(chief_stopped, 30, "the chief's process to be stopped")


async def test_per_user_gpu_cap_holds_launches_until_gpus_free(
        kube_env: KubeCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEHUB_K8S_MAX_GPUS_PER_USER", "1")
    be = KubernetesBackend.from_env()
    events = Events()
    be.subscribe(events)
    await be.start()
    try:
        gate = kube_env.data_dir / "gate"
        first = kube_launch(kube_env, 1, "", command="python wait.py",
                            resources=Resources(gpu=1))
        (first.workdir / "wait.py").write_text(
            f"import os, time\nwhile not os.path.exists({str(gate)!r}):\n    time.sleep(0.1)\n")
        second = kube_launch(kube_env, 2, "print('second ran')", resources=Resources(gpu=1))
        other = kube_launch(kube_env, 3, "print('bob ran')", resources=Resources(gpu=1),
                            owner="bob")
        assert be.can_launch(Resources(gpu=1), owner="alice")
        for la in (first, second, other):
            await be.launch(la)
        assert not be.can_launch(Resources(gpu=1), owner="alice")
        assert be.can_launch(Resources(gpu=0), owner="alice")
        assert kube_env.get("jobs", "tunehub-s3-t2-a1") is None  # held: alice is at her cap
        assert (await events.final(3)).kind == "succeeded"  # bob is not limited by alice
        assert kube_env.get("jobs", "tunehub-s3-t2-a1") is None
        gate.write_text("")
        assert (await events.final(1)).kind == "succeeded"
        assert (await events.final(2)).kind == "succeeded"
        assert "second ran" in second.log_path.read_text()
    finally:
        await be.close()


def test_check_uses_the_api_servers_admission(kube_env: KubeCluster,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A Job the API server would reject (here: a bad label value from the settings) is
    refused at submission by a server-side dry run, which stores nothing."""
    monkeypatch.setenv("TUNEHUB_K8S_POD_LABELS", json.dumps({"team": "data science!"}))
    with pytest.raises(SpecError, match="the cluster refuses the trial Job:.*data science") as err:
        KubernetesBackend.from_env().check(spec(cpu=1))
    assert err.value.field == "spec"
    assert kube_env.objects("jobs") == []
    monkeypatch.delenv("TUNEHUB_K8S_POD_LABELS")
    monkeypatch.setenv("TUNEHUB_HOME", str(kube_env.data_dir.parent / "elsewhere"))
    with pytest.raises(SpecError, match="TUNEHUB_HOME inside TUNEHUB_DATA"):
        KubernetesBackend.from_env().check(spec(cpu=1))


async def test_watch_relists_after_410_and_keeps_reporting(
        kube_env: KubeCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Watch history compacted while a trial runs: a watch gets 410 Gone, lists again and
    the attempt's outcome still arrives."""
    from tuner.backends.kubernetes import api

    monkeypatch.setattr(api, "WATCH_SECONDS", 1)  # reconnect often, to meet the 410 soon
    be = KubernetesBackend.from_env()
    events = Events()
    be.subscribe(events)
    await be.start()
    try:
        gate = kube_env.data_dir / "gate"
        la = kube_launch(kube_env, 1, "", command="python wait.py")
        (la.workdir / "wait.py").write_text(
            f"import os, time\nwhile not os.path.exists({str(gate)!r}):\n    time.sleep(0.1)\n"
            "print('after compaction')\n")
        await be.launch(la)

        async def running() -> bool:
            pods = kube_env.objects("pods", label_selector=f"{m.TRIAL_LABEL}=1")
            return bool(pods) and pods[0]["status"].get("phase") == "Running"

        await eventually(running, 30, "the trial pod to run")
        lists = kube_env.counters.snapshot().get(("list", "pods"), 0)
        # A write the pod watch does not see, so its resourceVersion is older than the
        # compaction for sure (watching from exactly the compacted revision is allowed).
        kube_env.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "bump"}})
        kube_env.compact()

        async def relisted() -> bool:
            return kube_env.counters.snapshot().get(("list", "pods"), 0) > lists

        # The pod watch's resourceVersion is older than the compaction: 410, then a new list.
        await eventually(relisted, 30, "the pod watch to list again after 410 Gone")
        gate.write_text("")
        done = await events.final(1)
        assert done.kind == "succeeded", done
        assert "after compaction" in la.log_path.read_text()
    finally:
        await be.close()


async def test_unreachable_cluster_is_one_clear_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.service_fixtures import free_port
    from tuner.backends.kubernetes import api as kube_api
    from tuner.backends.kubernetes.api import ClusterUnavailable

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "dead",
        "clusters": [{"name": "dead", "cluster": {"server": f"http://127.0.0.1:{free_port()}"}}],
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "dead", "context": {"cluster": "dead", "user": "u"}}]}))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setenv("TUNEHUB_DATA", str(tmp_path))
    monkeypatch.setenv("TUNEHUB_HOME", str(tmp_path / ".tunehub"))
    # The calls try a refused connection again for API_PATIENCE (a blink fails nothing); the
    # subject here is what is said once they give up, so they give up after a moment.
    monkeypatch.setattr(kube_api, "API_PATIENCE", 1.0)
    be = KubernetesBackend.from_env()
    with pytest.raises(ClusterUnavailable, match="cannot reach the Kubernetes API") as err:
        await asyncio.to_thread(be.check, spec(cpu=1))
    assert "\n" not in str(err.value)
    with pytest.raises(ClusterUnavailable, match="cannot watch Jobs and pods"):
        await be.start()
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    with pytest.raises(ClusterUnavailable, match="KUBECONFIG: .*missing does not exist"):
        await KubernetesBackend.from_env().start()


async def test_preempted_low_priority_trial_is_rerun_by_its_job(
        kube_env: KubeCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A notebook (higher priority) takes the A100s of a running low-priority trial: the pod is
    preempted, the Job replaces it (podFailurePolicy ignores DisruptionTarget) and the attempt
    finishes once the GPUs are free again, with no failure reported."""
    monkeypatch.setenv("TUNEHUB_K8S_UNSCHEDULABLE_TIMEOUT", "120")
    kube_env.create({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                     "metadata": {"name": "notebooks"}, "value": 1000})
    be = KubernetesBackend.from_env()
    events = Events()
    be.subscribe(events)
    await be.start()
    try:
        gate = kube_env.data_dir / "gate"
        la = kube_launch(kube_env, 1, "", command="python wait.py", priority="low",
                         resources=Resources(gpu=2, gpu_type="a100"))
        (la.workdir / "wait.py").write_text(
            f"import os, time\nwhile not os.path.exists({str(gate)!r}):\n    time.sleep(0.1)\n")
        await be.launch(la)
        selector = f"{m.TRIAL_LABEL}=1"

        async def trial_running() -> list[dict]:
            return [p for p in kube_env.objects("pods", label_selector=selector)
                    if p["status"].get("phase") == "Running"]

        first_pod = (await eventually(trial_running, 30, "the trial pod to run"))[0]
        notebook_done = kube_env.data_dir / "notebook-done"
        wait_for_file = (f"import os, time\nwhile not os.path.exists({str(notebook_done)!r}):"
                         "\n    time.sleep(0.1)\n")
        kube_env.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "notebook"},
                         "spec": {"priorityClassName": "notebooks", "restartPolicy": "Never",
                                  "securityContext": RESTRICTED_POD,
                                  "nodeSelector": {
                                      GpuNames().product_label: "NVIDIA-A100-SXM4-80GB"},
                                  "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                                  "containers": [{
                                      "name": "nb", "image": "notebook",
                                      "securityContext": RESTRICTED_CONTAINER,
                                      "command": ["python", "-c", wait_for_file],
                                      "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}})

        async def notebook_running() -> bool:
            pod = kube_env.get("pods", "notebook")
            return bool(pod) and pod["status"].get("phase") == "Running"

        await eventually(notebook_running, 30, "the notebook to preempt the trial")
        assert all(p["metadata"]["name"] != first_pod["metadata"]["name"]
                   for p in await trial_running())
        notebook_done.write_text("")  # the user stops the notebook: the GPUs are free again

        async def replaced() -> list[dict]:
            pods = await trial_running()
            return [p for p in pods if p["metadata"]["name"] != first_pod["metadata"]["name"]]

        await eventually(replaced, 30, "the Job's replacement pod to run")
        gate.write_text("")
        done = await events.final(1)
        assert done.kind == "succeeded" and done.attempt == 1, done
        assert [e.kind for e in events.seen if e.kind != "started"] == ["succeeded"]
    finally:
        await be.close()


@pytest.mark.parametrize("n", [1, 5])
async def test_api_requests_per_trial_are_constant(
        backend: tuple[KubernetesBackend, Events], kube_env: KubeCluster, n: int) -> None:
    """Watching, not polling: each trial costs the same writes (Job, Secret, NetworkPolicy,
    delete at cleanup) and reads (its log, once), however many run at once."""
    be, events = backend
    kube_env.counters.reset()
    for trial in range(1, n + 1):
        await be.launch(kube_launch(kube_env, trial, "import time; time.sleep(0.5)"))
    for trial in range(1, n + 1):
        assert (await events.final(trial)).kind == "succeeded"
    await be.cleanup(3)
    counts = kube_env.counters.snapshot()
    assert kube_env.counters.writes() == 4 * n, counts
    assert counts[("create", "jobs")] == counts[("delete", "jobs")] == n, counts
    assert counts[("create", "networkpolicies")] == n, counts
    assert counts[("get", "pods/log")] == n, counts
    assert counts.get(("get", "jobs"), 0) == 0 and counts.get(("get", "pods"), 0) == 0, counts


# --- under the chart's RBAC and the namespace's quota ----------------------------------------

async def test_tuner_role_grants_exactly_the_verbs_the_backend_uses(
        kube_env: KubeCluster) -> None:
    """Every path of the backend, as the chart's tuner ServiceAccount: the verbs it used are
    the verbs its Role grants (a missing one is a 403 that fails the path, an unused one is
    listed here), and only the cluster-wide reads it tolerates being refused were refused."""
    be = KubernetesBackend.from_env()
    events = Events()
    be.subscribe(events)
    await be.start()
    second = KubernetesBackend.from_env()
    try:
        await asyncio.to_thread(be.check, spec(cpu=1))  # the server-side dry run
        # Two workers: the Indexed Job, its token Secret and headless Service, both logs.
        two = kube_launch(kube_env, 1, "print('worker')", resources=Resources(workers=2))
        await be.launch(two)
        assert (await events.final(1)).kind == "succeeded"
        # A tuner restarted while an attempt runs retries its create: 409, the Job is read
        # back and adopted, its token Secret re-keyed.
        gate = kube_env.data_dir / "gate"
        held = kube_launch(kube_env, 2, "", command="python wait.py")
        (held.workdir / "wait.py").write_text(
            f"import os, time\nwhile not os.path.exists({str(gate)!r}):\n    time.sleep(0.1)\n")
        await be.launch(held)
        await second.start()
        await second.launch(held)
        assert len(kube_env.objects("jobs", label_selector=f"{m.TRIAL_LABEL}=2")) == 1
        await second.cancel(2, 1)  # deletes the Job
        await be.cleanup(3)
    finally:
        await second.close()
        await be.close()
    used = kube_env.exercised(TUNER_ACCOUNT)
    # Kueue's part of the Role (the chart's example queues trials) is used by a backend with
    # a LocalQueue: tests/test_kubernetes_kueue.py checks it is exercised there; the
    # ClusterRole's ClusterQueue read by the pool view: tests/test_pool_kubernetes.py.
    granted = kube_env.granted(TUNER_ACCOUNT) - {
        ("kueue.x-k8s.io", "workloads", "list"), ("kueue.x-k8s.io", "workloads", "watch"),
        ("visibility.kueue.x-k8s.io", "localqueues/pendingworkloads", "get"),
        ("kueue.x-k8s.io", "clusterqueues", "get")}
    assert used == granted, (f"granted but never used: {sorted(granted - used)}; "
                             f"used but not granted: {sorted(used - granted)}")
    assert kube_env.exercised(TUNER_ACCOUNT, allowed=False) == {
        ("", "nodes", "list"), ("scheduling.k8s.io", "priorityclasses", "get")}


async def test_trial_waits_for_the_namespace_quota_and_says_why(
        backend: tuple[KubernetesBackend, Events], kube_env: KubeCluster) -> None:
    """The quota holds one trial's CPU: the second trial's Job cannot create its pod, so the
    attempt waits (no failure) with the API server's reason, and runs once the first ends."""
    be, events = backend
    kube_env.create({"apiVersion": "v1", "kind": "ResourceQuota",
                     "metadata": {"name": "compute"}, "spec": {"hard": {"requests.cpu": "1"}}})
    gate = kube_env.data_dir / "gate"
    first = kube_launch(kube_env, 1, "", command="python wait.py")
    (first.workdir / "wait.py").write_text(
        f"import os, time\nwhile not os.path.exists({str(gate)!r}):\n    time.sleep(0.1)\n")
    await be.launch(first)

    async def running() -> bool:
        pods = kube_env.objects("pods", label_selector=f"{m.TRIAL_LABEL}=1")
        return bool(pods) and pods[0]["status"].get("phase") == "Running"

    await eventually(running, 30, "the first trial to run")
    await be.launch(kube_launch(kube_env, 2, "print('second ran')"))

    async def waiting() -> TrialEvent | None:
        return next((e for e in events.seen if e.trial_id == 2 and e.kind == "waiting"), None)

    wait = await eventually(waiting, 30, "the second trial to say it waits")
    assert wait.reason.startswith("waiting: the cluster does not create its pod yet: pods "
                                  '"tunehub-s3-t2-a1-'), wait
    assert wait.reason.endswith("is forbidden: exceeded quota: compute, requested: "
                                "requests.cpu=1, used: requests.cpu=1, limited: "
                                "requests.cpu=1"), wait
    assert not [e for e in events.seen if e.trial_id == 2 and e.final]
    gate.write_text("")
    assert (await events.final(1)).kind == "succeeded"
    done = await events.final(2)
    assert done.kind == "succeeded", done
    assert [e.kind for e in events.seen if e.trial_id == 2] == ["waiting", "started",
                                                                "succeeded"]


async def test_pods_the_namespace_never_admits_fail_the_attempt_at_once(
        backend: tuple[KubernetesBackend, Events], kube_env: KubeCluster) -> None:
    """A refusal no wait can fix (a LimitRange bound here, Pod Security likewise) ends the
    attempt with the API server's reason instead of leaving it waiting."""
    be, events = backend
    kube_env.create({"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "bounds"},
                     "spec": {"limits": [{"type": "Container", "max": {"cpu": "1"}}]}})
    await be.launch(kube_launch(kube_env, 1, "print(1)", resources=Resources(cpu=2)))
    failed = await events.final(1)
    assert failed.kind == "failed", failed
    assert failed.reason.startswith('the cluster refuses its pods: pods "tunehub-s3-t1-a1-')
    assert failed.reason.endswith("is forbidden: maximum cpu usage per Container is 1, but "
                                  "limit is 2"), failed
    assert "waiting" not in [e.kind for e in events.seen]


async def test_dry_run_reports_the_pod_security_warning(kube_env: KubeCluster) -> None:
    """What check() refuses a sweep with: the API server admits a Job whose pods Pod Security
    will refuse, with a warning, which the dry run returns."""
    from tuner.backends.kubernetes.api import Kube, connect

    s = KubeSettings.from_env()
    kube = Kube(await connect(s), s.namespace)
    try:
        body = m.job(s, launch(kube_env.data_dir))
        assert await kube.dry_run_warnings(body) == []
        body["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privileged"] = True
        assert await kube.dry_run_warnings(body) == [
            'would violate PodSecurity "restricted:latest": privileged (container "trial" must '
            "not set securityContext.privileged=true)"]
    finally:
        await kube.close()
    assert kube_env.objects("jobs") == []
