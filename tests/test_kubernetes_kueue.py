"""The GPU pool through Kueue, against the emulated cluster over real HTTP (kubesim: its Kueue
admits by ClusterQueue quota, gates queued notebook pods, evicts by workload priority and
serves the visibility API's positions), with the backend running under the chart's tuner Role.

What a person sees: a notebook queued in Kueue with its workload priority takes the GPUs of a
running low-priority trial; the trial's attempt ends *preempted* (not failed), and the next
attempt of the same trial waits in the queue, saying where it stands, then resumes from its
checkpoint. A GPU trial no node can hold yet waits with the scheduler's reason instead of
failing after a timeout.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kubesim import KubeCluster
from kubesim.waiting import eventually
from tests.chart_security import TUNER_ACCOUNT
from tests.test_kubernetes_backend import (  # noqa: F401  (fixture kube_env)
    RESTRICTED_CONTAINER,
    RESTRICTED_POD,
    Events,
    kube_env,
    kube_launch,
)
from tuner.backends._base import TrialEvent
from tuner.backends.kubernetes import KubernetesBackend, KubeSettings
from tuner.backends.kubernetes import kueue as k
from tuner.backends.kubernetes import manifests as m
from tuner.sdk.training import ENV_CHECKPOINT_DIR
from tuner.spec import Resources

REPO = Path(__file__).resolve().parent.parent
KUEUE = "kueue.x-k8s.io/v1beta2"
A100 = "NVIDIA-A100-SXM4-80GB"
WORKLOAD_CLASSES = {"notebook": 1000, "high": 500, "normal": 100, "low": 10}

# A trial that checkpoints each step with the SDK and stops once the gate file exists; it
# prints where it resumed from.
TRAINING = """\
import os, sys, time
from tuner.sdk import checkpoints as ck
got = ck.restore()
start = got[1] if got else 0
print("resumed at", start, flush=True)
step = start
while not os.path.exists(sys.argv[1]):
    step += 1
    ck.checkpoint({"step": step}, step)
    open("progress.new", "w").write(str(step))
    os.replace("progress.new", "progress")  # whole, even if the pod is killed mid-write
    time.sleep(0.05)
print("finished at", step, flush=True)
"""


def kueue_pool(kube: KubeCluster, cluster_queue: str = "team-a",
               preemption: bool = True) -> None:
    """A team's ClusterQueue holding the A100 node's 2 GPUs, preempting by priority inside it
    (unless not ``preemption``), its LocalQueue ``team``, and workload priority classes as
    the chart makes them."""
    for name, value in WORKLOAD_CLASSES.items():
        kube.create({"apiVersion": KUEUE, "kind": "WorkloadPriorityClass",
                     "metadata": {"name": f"wpc-{name}"}, "value": value})
    kube.create({"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": "a100"},
                 "spec": {"nodeLabels": {"nvidia.com/gpu.product": A100}}})
    kube.create({"apiVersion": KUEUE, "kind": "ClusterQueue",
                 "metadata": {"name": cluster_queue},
                 "spec": {"namespaceSelector": {},
                          "preemption": {"withinClusterQueue": (
                              "LowerPriority" if preemption else "Never")},
                          "resourceGroups": [{
                              "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                              "flavors": [{"name": "a100", "resources": [
                                  {"name": "cpu", "nominalQuota": "16"},
                                  {"name": "memory", "nominalQuota": "64Gi"},
                                  {"name": "nvidia.com/gpu", "nominalQuota": "2"}]}]}]}})
    kube.create({"apiVersion": KUEUE, "kind": "LocalQueue", "metadata": {"name": "team"},
                 "spec": {"clusterQueue": cluster_queue}})


@pytest.fixture
async def queued(kube_env: KubeCluster, monkeypatch: pytest.MonkeyPatch  # noqa: F811
                 ) -> AsyncIterator[tuple[KubernetesBackend, Events]]:
    kueue_pool(kube_env)
    monkeypatch.setenv("TUNEHUB_K8S_QUEUE", "team")
    monkeypatch.setenv("TUNEHUB_K8S_CLUSTER_QUEUE", "team-a")
    monkeypatch.setenv("TUNEHUB_K8S_WORKLOAD_PRIORITY_CLASSES", json.dumps(
        {p: f"wpc-{p}" for p in ("low", "normal", "high")}))
    be = KubernetesBackend.from_env()
    events = Events()
    be.subscribe(events)
    await be.start()
    try:
        yield be, events
    finally:
        await be.close()


def notebook(name: str, done: Path) -> dict:
    """A notebook pod as the hub's KubeSpawner makes it with ``kueue.queueNotebooks``: queued
    in the LocalQueue with the notebook workload priority. Its pod priority is 0, below the
    trials' PriorityClass: only Kueue can make room for it, not the scheduler."""
    wait = f"import os, time\nwhile not os.path.exists({str(done)!r}):\n    time.sleep(0.1)\n"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {m.QUEUE_LABEL: "team",
                                                  m.PRIORITY_LABEL: "wpc-notebook"}},
            "spec": {"restartPolicy": "Never", "securityContext": RESTRICTED_POD,
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                     "containers": [{"name": "nb", "image": "notebook",
                                     "securityContext": RESTRICTED_CONTAINER,
                                     "command": ["python", "-c", wait],
                                     "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}


def training_launch(kube: KubeCluster, trial: int, attempt: int, priority: str, gate: Path):
    la = kube_launch(kube, trial, "", command=f"python train.py {gate}", attempt=attempt,
                     priority=priority, timeout=None,
                     resources=Resources(gpu=2, gpu_type="a100", memory="1Gi"))
    (la.workdir / "train.py").write_text(TRAINING)
    la.env.update({"PYTHONPATH": str(REPO),
                   ENV_CHECKPOINT_DIR: str(la.workdir / "checkpoints")})
    return la


async def final(events: Events, trial: int, attempt: int, timeout: float = 120) -> TrialEvent:
    async def find() -> TrialEvent | None:
        return next((e for e in events.seen if (e.trial_id, e.attempt) == (trial, attempt)
                     and e.final), None)
    return await eventually(find, timeout, f"trial {trial} attempt {attempt} to end")


async def waiting_reason(events: Events, trial: int, attempt: int, wanted: str,
                         timeout: float = 60) -> TrialEvent:
    async def find() -> TrialEvent | None:
        return next((e for e in reversed(events.seen) if (e.trial_id, e.attempt) == (
            trial, attempt) and e.kind == "waiting" and wanted in e.reason), None)
    return await eventually(find, timeout, f"trial {trial} to wait with {wanted!r}")


async def test_kueue_evicts_a_trial_for_a_notebook_and_it_resumes_as_preempted(
        queued: tuple[KubernetesBackend, Events], kube_env: KubeCluster) -> None:  # noqa: F811
    be, events = queued
    data = kube_env.data_dir
    gate_1, gate_2, notebook_done = data / "gate-1", data / "gate-2", data / "notebook-done"
    first = training_launch(kube_env, 1, 1, "low", gate_1)
    await be.launch(first)
    job = kube_env.get("jobs", "tunehub-s3-t1-a1")
    assert job is not None
    assert job["metadata"]["labels"][m.PRIORITY_LABEL] == "wpc-low"
    assert job["metadata"]["labels"][m.QUEUE_LABEL] == "team"

    async def progressed() -> bool:
        progress = first.workdir / "progress"
        return progress.exists() and int(progress.read_text()) >= 3
    await eventually(progressed, 60, "the low-priority trial to checkpoint a few steps")

    # A notebook queued in Kueue needs both GPUs: Kueue evicts the trial's Workload.
    kube_env.create(notebook("jupyter-bob", notebook_done))
    preempted = await final(events, 1, 1)
    assert preempted.kind == "preempted", preempted
    assert "Kueue evicted it (Preempted to accommodate a workload" in preempted.reason
    assert "resumes from its last checkpoint" in preempted.reason
    assert [e.kind for e in events.seen if e.trial_id == 1 and e.kind != "waiting"] == [
        "started", "preempted"]

    async def notebook_running() -> dict | None:
        pod = kube_env.get("pods", "jupyter-bob")
        return pod if pod and pod["status"].get("phase") == "Running" else None
    pod = await eventually(notebook_running, 60, "the notebook to be admitted and run")
    assert pod["spec"]["nodeName"] == "gpu-a100-0" and not pod["spec"].get("schedulingGates")
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": A100}  # its flavor's
    workload = next(w for w in kube_env.objects("workloads", group="kueue.x-k8s.io",
                                                version="v1beta2")
                    if w["metadata"]["ownerReferences"][0]["name"] == "jupyter-bob")
    assert workload["spec"]["priorityClassRef"] == {
        "group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": "wpc-notebook"}
    assert workload["spec"]["priority"] == 1000

    async def evicted_job_gone() -> bool:
        return kube_env.get("jobs", "tunehub-s3-t1-a1") is None
    await eventually(evicted_job_gone, 60, "the evicted attempt's Job to be deleted")
    saved = int((first.workdir / "progress").read_text())
    assert saved >= 3

    # The trial goes back to the queue (same trial, next attempt); a high-priority trial
    # queued after it goes ahead of it. Each says where it stands.
    gate_1.write_text("")
    await be.launch(training_launch(kube_env, 1, 2, "low", gate_1))
    # Kueue writes its reason after its scheduling cycle: until then the position alone.
    wait = await waiting_reason(events, 1, 2, "more needed)")
    assert wait.reason == (
        "waiting for quota in ClusterQueue team-a: 1st in queue (couldn't assign flavors to "
        "pod set main: insufficient quota for nvidia.com/gpu in flavor a100, 2 more needed)")
    await be.launch(training_launch(kube_env, 2, 1, "high", gate_2))
    await waiting_reason(events, 2, 1, "waiting for quota in ClusterQueue team-a: 1st in queue")
    await waiting_reason(events, 1, 2, "waiting for quota in ClusterQueue team-a: 2nd in queue")

    # The notebook ends: the high-priority trial runs first, then the preempted one resumes.
    gate_2.write_text("")
    notebook_done.write_text("")
    assert (await final(events, 2, 1)).kind == "succeeded"
    await waiting_reason(events, 1, 2, "1st in queue")
    done = await final(events, 1, 2)
    assert done.kind == "succeeded", done
    log = first.log_path.read_text()
    resumed = int(log.split("resumed at", 1)[1].split()[0])
    assert resumed >= 3, log  # from its checkpoint, not from scratch
    assert [e.kind for e in events.seen if e.trial_id == 1 and e.final] == [
        "preempted", "succeeded"]

    # The chart's Role let the tuner do exactly this: watch Workloads, read the positions.
    used = kube_env.exercised(TUNER_ACCOUNT)
    assert {("kueue.x-k8s.io", "workloads", "list"), ("kueue.x-k8s.io", "workloads", "watch"),
            ("visibility.kueue.x-k8s.io", "localqueues/pendingworkloads", "get")} <= used


async def test_an_eviction_while_the_tuner_was_down_is_a_preemption_after_its_restart(
        queued: tuple[KubernetesBackend, Events], kube_env: KubeCluster) -> None:  # noqa: F811
    """Kueue evicts the trial while no tuner runs; the restarted tuner adopts the suspended
    Job, learns from its Workload that Kueue evicted it, and ends the attempt preempted."""
    be, _ = queued
    data = kube_env.data_dir
    first = training_launch(kube_env, 1, 1, "low", data / "gate")
    await be.launch(first)

    async def progressed() -> bool:
        progress = first.workdir / "progress"
        return progress.exists() and int(progress.read_text()) >= 2
    await eventually(progressed, 60, "the trial to checkpoint")
    await be.close()  # the tuner dies

    kube_env.create(notebook("jupyter-bob", data / "notebook-done"))

    async def evicted_and_stopped() -> bool:
        job = kube_env.get("jobs", "tunehub-s3-t1-a1") or {}
        return bool(job.get("spec", {}).get("suspend")) and not job["status"].get("active") \
            and not job["status"].get("terminating")
    await eventually(evicted_and_stopped, 60, "Kueue to evict the trial's Job")

    restarted = KubernetesBackend.from_env()
    events = Events()
    restarted.subscribe(events)
    await restarted.start()
    try:
        assert await restarted.reconcile(3, [first]) == {(1, 1)}
        preempted = await final(events, 1, 1)
        assert preempted.kind == "preempted", preempted
        assert "Kueue evicted it (Preempted to accommodate a workload" in preempted.reason

        async def gone() -> bool:
            return kube_env.get("jobs", "tunehub-s3-t1-a1") is None
        await eventually(gone, 60, "the evicted Job to be deleted")
    finally:
        await restarted.close()


async def test_visibility_api_orders_by_priority_then_age(kube_env: KubeCluster  # noqa: F811
                                                          ) -> None:
    """The emulated visibility API as Kueue serves it: a LocalQueue's pending workloads with
    their positions, for those allowed to read it (the chart's tuner Role) and no one else."""
    import httpx

    kueue_pool(kube_env)
    blocker = notebook("jupyter-ann", kube_env.data_dir / "never")
    kube_env.create(blocker)
    for name, priority in (("a", "low"), ("b", "high"), ("c", "low")):
        kube_env.create({"apiVersion": "batch/v1", "kind": "Job",
                         "metadata": {"name": name, "labels": {
                             m.QUEUE_LABEL: "team", m.PRIORITY_LABEL: f"wpc-{priority}"}},
                         "spec": {"template": {"spec": {
                             "restartPolicy": "Never", "securityContext": RESTRICTED_POD,
                             "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                             "containers": [{"name": "t", "image": "x", "command": ["true"],
                                             "securityContext": RESTRICTED_CONTAINER,
                                             "resources": {"limits": {
                                                 "nvidia.com/gpu": "1"}}}]}}}})
    path = ("/apis/visibility.kueue.x-k8s.io/v1beta1/namespaces/tunehub/localqueues/team/"
            "pendingworkloads")
    kubeconfig = kube_env.service_account_kubeconfig(TUNER_ACCOUNT)
    import yaml
    token = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]

    async def three_pending() -> dict | None:
        async with httpx.AsyncClient(base_url=kube_env.url, timeout=10) as http:
            r = await http.get(path, headers={"Authorization": f"Bearer {token}"})
        r.raise_for_status()
        body = r.json()
        return body if len(body["items"]) == 3 else None
    body = await eventually(three_pending, 60, "three Jobs pending behind the notebook")
    order = [(k.workload_job(i), i["positionInClusterQueue"], i["positionInLocalQueue"],
              i["priority"]) for i in body["items"]]
    assert order == [("b", 0, 0, 500), ("a", 1, 1, 10), ("c", 2, 2, 10)]
    assert k.positions(body) == {"b": 0, "a": 1, "c": 2}
    r = httpx.get(kube_env.url + path, timeout=10)  # anonymous: refused
    assert r.status_code == 403


async def test_an_unschedulable_gpu_trial_waits_its_turn_by_default(
        kube_env: KubeCluster, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """No node has room for the trial (a pod the trial may not preempt holds the A100s): it
    waits with the scheduler's reason, no failure, and runs once the GPUs are free."""
    monkeypatch.delenv("TUNEHUB_K8S_UNSCHEDULABLE_TIMEOUT")
    assert KubeSettings.from_env().unschedulable_timeout is None
    kube_env.create({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                     "metadata": {"name": "interactive"}, "value": 1000})
    held = kube_env.data_dir / "released"
    holder = notebook("jupyter-cy", held)
    holder["metadata"]["labels"] = {}
    holder["spec"]["priorityClassName"] = "interactive"
    holder["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": A100}
    kube_env.create(holder)
    be = KubernetesBackend.from_env()
    events = Events()
    be.subscribe(events)
    await be.start()
    try:
        la = kube_launch(kube_env, 1, "print('ran')",
                         resources=Resources(gpu=2, gpu_type="a100", memory="1Gi"))
        await be.launch(la)
        wait = await waiting_reason(events, 1, 1, "unschedulable")
        assert wait.reason.startswith("waiting: unschedulable: 0/3 nodes are available"), wait
        assert "Insufficient nvidia.com/gpu" in wait.reason
        held.write_text("")  # the notebook stops
        done = await final(events, 1, 1)
        assert done.kind == "succeeded", done
        kinds = [e.kind for e in events.seen]
        # Its Job started (its pod exists), the pod waited, then ran: the wait is over.
        assert kinds[-2:] == ["started", "succeeded"], events.seen
        assert set(kinds[:-2]) == {"started", "waiting"}, events.seen
    finally:
        await be.close()


# --- what Kueue's objects mean, as words (unit) ------------------------------------------------

def test_waiting_reason_and_eviction_in_words() -> None:
    pending = {"status": {"conditions": [{
        "type": "QuotaReserved", "status": "False", "reason": "Pending",
        "message": "couldn't assign flavors to pod set main: insufficient quota"}]}}
    assert k.waiting_reason(pending, "ClusterQueue team-a", 2) == (
        "waiting for quota in ClusterQueue team-a: 3rd in queue (couldn't assign flavors to "
        "pod set main: insufficient quota)")
    assert k.waiting_reason(pending, "LocalQueue team", None) == (
        "waiting for quota in LocalQueue team (couldn't assign flavors to pod set main: "
        "insufficient quota)")
    admitted = {"status": {"conditions": [{"type": "QuotaReserved", "status": "True"},
                                          {"type": "Admitted", "status": "True"}]}}
    assert k.waiting_reason(admitted, "ClusterQueue team-a", 0) is None
    assert k.eviction(admitted) is None
    evicted = {"status": {"conditions": [{"type": "Evicted", "status": "True",
                                          "reason": "Preempted", "message": "by a notebook"}]}}
    assert k.eviction(evicted) == "by a notebook"
    assert [k.ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th"]
    pod_owned = {"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Pod",
                                                   "name": "jupyter-bob"}]}}
    assert k.workload_job(pod_owned) is None


def test_settings_read_the_kueue_and_waiting_values(tmp_path: Path) -> None:
    env = {"TUNEHUB_DATA": str(tmp_path), "TUNEHUB_K8S_NAMESPACE": "lab",
           "TUNEHUB_K8S_QUEUE": "team", "TUNEHUB_K8S_CLUSTER_QUEUE": "team-a",
           "TUNEHUB_K8S_WORKLOAD_PRIORITY_CLASSES": '{"low": "wpc-low"}'}
    s = KubeSettings.from_env(env)
    assert (s.queue, s.cluster_queue, dict(s.workload_priority_classes)) == (
        "team", "team-a", {"low": "wpc-low"})
    assert s.unschedulable_timeout is None  # waits by default
    assert KubeSettings.from_env({**env, "TUNEHUB_K8S_UNSCHEDULABLE_TIMEOUT": "0"}
                                 ).unschedulable_timeout == 0
    assert KubeSettings.from_env({**env, "TUNEHUB_K8S_UNSCHEDULABLE_TIMEOUT": "600"}
                                 ).unschedulable_timeout == 600

