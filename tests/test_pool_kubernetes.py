"""Everyone sees the pool on Kubernetes too (issue 25): against the emulated cluster over real
HTTP (kubesim's Kueue keeps its ClusterQueue's status and serves the visibility API), the
tuner's pool source under the chart's tuner Role and ClusterRole shows who holds GPUs (a trial
attempt's Job, a notebook's pod) since when, each flavor's quota and use, the pending trial
with its Kueue position and reason, and the GPU-hours of a holding that ended. Through the
tuner service a person with the read scope sees it and cannot change it."""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kubesim import KubeCluster
from kubesim.waiting import eventually
from tests.chart_security import TUNER_ACCOUNT, chart_rbac, tuner_kubeconfig
from tests.nvml_standin import GiB, StandIn
from tests.polling import wait_for
from tests.service_fixtures import running_tuner_hub
from tests.test_gpu_usage import nvml_library, standin  # noqa: F401  (fixtures)
from tests.test_hub_groups import groups_api  # noqa: F401  (fixture)
from tests.test_kubernetes_backend import (  # noqa: F401  (fixture kube_env)
    RESTRICTED_CONTAINER,
    RESTRICTED_POD,
    kube_env,
    kube_launch,
)
from tests.test_kubernetes_kueue import kueue_pool
from tests.test_pool_metrics import _metric
from tunehub_base.gpu_meter import UsePolicy
from tunehub_base.scopes import READ
from tuner.backends.kubernetes import KubernetesBackend, KubeSettings
from tuner.backends.kubernetes import manifests as m
from tuner.cli import main as cli_main
from tuner.db import Database
from tuner.db.models import GpuHolding
from tuner.pool_sources.kube_ledger import KubeHoldingLedger
from tuner.pool_sources.kube_notebook_use import with_report
from tuner.pool_sources.kubernetes import KubernetesPoolSource
from tuner.scheduling.hub_groups import HubGroups
from tuner.spec import Resources

WEB = Path(__file__).resolve().parent.parent / "tuner" / "web"
WAIT = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]):\n    time.sleep(0.05)\n"


def chart_cluster_queue(kube: KubeCluster) -> str:
    """The ClusterQueue the chart's tuner may read (its ClusterRole's one resource name)."""
    for obj in chart_rbac(kube.namespace):
        for rule in obj.get("rules") or [] if obj["kind"] == "ClusterRole" else []:
            if "clusterqueues" in rule.get("resources", []):
                return str(rule["resourceNames"][0])
    raise AssertionError("the chart grants the tuner no ClusterQueue")


def team_queue(kube: KubeCluster, monkeypatch: pytest.MonkeyPatch) -> str:
    """The chart's ClusterQueue with the A100 node's 2 GPUs (no preemption), its LocalQueue
    ``team``, workload priority classes; the tuner's settings pointing at them."""
    cq = chart_cluster_queue(kube)
    kueue_pool(kube, cq, preemption=False)
    monkeypatch.setenv("TUNEHUB_K8S_QUEUE", "team")
    monkeypatch.setenv("TUNEHUB_K8S_CLUSTER_QUEUE", cq)
    monkeypatch.setenv("TUNEHUB_K8S_WORKLOAD_PRIORITY_CLASSES", json.dumps(
        {p: f"wpc-{p}" for p in ("low", "normal", "high")}))
    return cq


def notebook_pod(person: str, done: Path) -> dict[str, Any]:
    """A one-GPU notebook pod as the chart's KubeSpawner makes it (its labels and
    annotations), queued in Kueue with the notebook workload priority."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": f"jupyter-{person}",
        "labels": {m.QUEUE_LABEL: "team", m.PRIORITY_LABEL: "wpc-notebook",
                   "app.kubernetes.io/instance": "tunehub", "component": "notebook",
                   "app.kubernetes.io/component": "notebook",
                   "app.kubernetes.io/managed-by": "kubespawner",
                   "hub.jupyter.org/username": person},
        "annotations": {"hub.jupyter.org/username": person}},
        "spec": {"restartPolicy": "Never", "securityContext": RESTRICTED_POD,
                 "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                 "containers": [{"name": "notebook", "image": "notebook",
                                 "securityContext": RESTRICTED_CONTAINER,
                                 "command": ["python", "-c", WAIT, str(done)],
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def gpu_trial(kube: KubeCluster, trial: int, gpus: int, gate: Path, priority: str = "normal"):
    la = kube_launch(kube, trial, "", command=f"python wait.py {gate}", priority=priority,
                     timeout=None, resources=Resources(gpu=gpus, gpu_type="a100", memory="1Gi"))
    (la.workdir / "wait.py").write_text(WAIT.replace("sys.argv[1]", repr(str(gate))))
    return la


@pytest.fixture
async def source(kube_env: KubeCluster, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
                 tmp_path: Path, groups_api: tuple[str, dict[str, object], list[str]],  # noqa: F811
                 ) -> AsyncIterator[tuple[KubernetesBackend, KubernetesPoolSource]]:
    team_queue(kube_env, monkeypatch)
    backend = KubernetesBackend.from_env()
    await backend.start()
    db = Database(f"sqlite:///{tmp_path / 'tuner.sqlite'}")
    # The hub's groups (bob is in vision), read as the service reads them: every group.
    hub_groups = HubGroups(groups_api[0], "service-token")
    await hub_groups.refresh(None)
    pool = KubernetesPoolSource(backend.settings, db, groups_of=hub_groups.of)
    await pool.start()
    try:
        yield backend, pool
    finally:
        await pool.close()
        await backend.close()
        db.dispose()


async def test_the_cluster_pool_shows_holders_flavors_the_queue_and_gpu_hours(
        source: tuple[KubernetesBackend, KubernetesPoolSource],
        kube_env: KubeCluster) -> None:  # noqa: F811
    backend, pool = source
    data = kube_env.data_dir
    began = time.time()
    await backend.launch(gpu_trial(kube_env, 1, 1, data / "gate-1"))  # alice's, 1 GPU
    kube_env.create(notebook_pod("bob", data / "bob-done"))
    await backend.launch(gpu_trial(kube_env, 2, 2, data / "gate-2"))  # 2 more: it waits

    async def settled() -> dict[str, Any] | None:
        view = await pool.pool()
        ready = view["held"] == 2 and view["queue"] and view["flavors"] and view["flavors"][
            0]["used"] == 2 and "1st in queue (couldn't" in view["queue"][0]["reason"]
        return view if ready else None
    view = await eventually(settled, 30, "two GPUs held, one trial queued, the flavor full")

    assert view["mode"] == "kubernetes" and "errors" not in view, view.get("errors")
    assert view["total"] == 2 and view["gpu_source"].startswith("Kueue ClusterQueue ")
    assert view["flavors"] == [{"flavor": "a100", "resource": "nvidia.com/gpu", "nominal": 2,
                                "used": 2, "borrowed": 0, "free": 0}]
    held = {row["holder"]["kind"]: row for row in view["gpus"]}
    trial, notebook = held["trial"], held["notebook"]
    assert trial["holder"]["person"] == "alice"
    assert trial["holder"]["what"] == "sweep 3 trial 1 attempt 1"
    assert notebook["holder"]["person"] == "bob" and notebook["holder"]["what"] == (
        "notebook of bob")
    for row in (trial, notebook):
        assert row["state"] == "held" and row["gpus"] == 1 and row["flavor"] == "a100"
        assert row["node"] == "gpu-a100-0" and row["gpu"] == "1 x a100 on gpu-a100-0"
        assert began - 2 <= row["since"] <= time.time() and row["since_iso"]
    # Each person's part of the team's quota (the ClusterQueue's 2 GPUs; no cap of their own).
    team = f"ClusterQueue {backend.settings.cluster_queue}"
    assert view["shares"] == [
        {"person": "alice", "account": team, "held_gpus": 1, "waiting_gpus": 2, "weight": 1.0,
         "share": 0.5, "fair_share_gpus": 2, "max_gpus": None},
        {"person": "bob", "account": team, "held_gpus": 1, "waiting_gpus": 0, "weight": 1.0,
         "share": 0.5, "fair_share_gpus": 2, "max_gpus": None}], view["shares"]
    (waiting,) = view["queue"]
    assert waiting["position"] == 1 and waiting["person"] == "alice"
    assert waiting["what"] == "sweep 3 trial 2 attempt 1" and waiting["gpus"] == 2
    assert waiting["priority"] == "normal" and waiting["kind"] == "trial"
    assert waiting["reason"] == (
        f"waiting for quota in ClusterQueue {backend.settings.cluster_queue}: 1st in queue "
        "(couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu in "
        "flavor a100, 2 more needed)")

    # bob's notebook ends (once it has held its GPU for two of the API's whole seconds): its
    # holding is closed with the pod's end, counted in GPU-hours; alice's running trial
    # counts up to now.
    async def two_seconds_held() -> bool:
        return time.time() >= notebook["since"] + 2
    await eventually(two_seconds_held, 5, "bob's notebook to hold its GPU a while")
    (data / "bob-done").write_text("")

    def bobs() -> GpuHolding | None:
        with pool.ledger.db.session() as s:
            row = s.query(GpuHolding).filter_by(person="bob").one_or_none()
            return row if row is not None and row.end is not None else None

    async def closed() -> GpuHolding | None:
        return bobs()
    ended = await eventually(closed, 30, "bob's notebook holding to be closed")
    assert ended.kind == "notebook" and ended.gpus == 1 and not ended.stale
    usage = await pool.usage(began - 60)
    assert usage["notebook"]["bob"] == pytest.approx((ended.end - ended.start) / 3600)
    assert usage["person"]["bob"] == usage["notebook"]["bob"] > 0
    assert usage["person"]["alice"] > 0 and usage["sweep"]["3"] == usage["person"]["alice"]
    # bob's hours count for his hub group too (alice is in none); written with the holding.
    assert usage["group"] == {"vision": usage["person"]["bob"]}, usage
    assert ended.groups == ["vision"]
    assert usage["mode"] == "kubernetes" and usage["since_iso"]
    (data / "gate-1").write_text("")
    (data / "gate-2").write_text("")

    # The sweeps page's GPU pool section, in Chromium, given these very answers: the same
    # holders, the flavor's row and the queue.
    page = await pool_page(view, usage)
    assert [r.split("\t") for r in page["#pool-flavors"]] == [
        ["a100", "nvidia.com/gpu", "2", "2", "0", "0"]], page
    assert sorted(r.split("\t")[:4] for r in page["#pool-gpus"]) == [
        ["1 x a100 on gpu-a100-0", "held", "alice", "sweep 3 trial 1 attempt 1"],
        ["1 x a100 on gpu-a100-0", "held", "bob", "notebook of bob"]], page
    assert [r.split("\t")[:6] for r in page["#pool-shares"]] == [
        ["alice", team, "1", "–", "1", "2"], ["bob", team, "1", "–", "1", "0"]], page
    assert [r.split("\t") for r in page["#pool-queue"]] == [
        ["1", "alice", "sweep 3 trial 2 attempt 1", "2", "normal", waiting["reason"]]], page

    # Everything was read under the chart's Role, and its ClusterRole's one ClusterQueue.
    used = kube_env.exercised(TUNER_ACCOUNT)
    assert {("kueue.x-k8s.io", "clusterqueues", "get"), ("kueue.x-k8s.io", "workloads", "list"),
            ("visibility.kueue.x-k8s.io", "localqueues/pendingworkloads", "get"),
            ("", "pods", "list"), ("", "pods", "watch")} <= used
    assert kube_env.exercised(TUNER_ACCOUNT, allowed=False) == set()


def test_a_person_reads_the_cluster_pool_and_cannot_change_it(
        kube_env: KubeCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    cq = team_queue(kube_env, monkeypatch)
    kube_env.create(notebook_pod("ann", kube_env.data_dir / "ann-done"))
    env = {"TUNEHUB_BACKENDS": "kubernetes", "KUBECONFIG": str(tuner_kubeconfig(kube_env)),
           "TUNEHUB_DATA": str(kube_env.data_dir),
           "TUNEHUB_HOME": str(kube_env.data_dir / ".tunehub"),
           "TUNEHUB_K8S_QUEUE": "team", "TUNEHUB_K8S_CLUSTER_QUEUE": cq}
    with running_tuner_hub(tmp_path, f"sqlite:///{tmp_path / 'tuner.sqlite'}", env) as hub:
        token = hub.token("bob", [READ])
        bob = hub.client(token)

        def ann_holds() -> dict[str, Any] | None:
            view = bob.get("pool").json()
            return view if view["held"] == 1 else None
        view = wait_for(ann_holds, timeout=20, what="ann's notebook to hold its GPU")
        assert view["mode"] == "kubernetes"
        assert view["gpus"][0]["holder"]["person"] == "ann"
        assert view["flavors"][0]["used"] == 1 and view["flavors"][0]["nominal"] == 2
        r = bob.get("usage", params={"since": "soon"})
        assert r.status_code == 400 and r.json()["field"] == "since"
        assert bob.get("usage").json()["field"] == "since"
        usage = bob.get("usage", params={"since": "2026-01-01"})
        assert usage.status_code == 200 and usage.json()["mode"] == "kubernetes"
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            for path in ("pool", "usage"):
                r = bob.request(method, path, json={"gpu": "0", "state": "free"})
                assert r.status_code == 405, (method, path, r.text)
        # tunehub pool from a notebook terminal (the CLI asks the service) shows the same
        # rows, with the flavors.
        monkeypatch.setenv("TUNEHUB_API_URL", f"{hub.url}services/tuner/")
        monkeypatch.setenv("TUNEHUB_TOKEN", token)
        capsys.readouterr()
        assert cli_main(["pool"]) == 0
        out = capsys.readouterr().out
        for words in ("GPU pool: 1 of 2 held (Kueue ClusterQueue", "notebook of ann",
                      "1 x a100 on gpu-a100-0", "Flavors (Kueue)", "nvidia.com/gpu"):
            assert words in out, out
        assert bob.post("pool/requests", json={"gpus": 1}).status_code == 401
        assert httpx.get(f"{hub.api}pool", timeout=30).status_code == 401
        assert kube_env.get("pods", "jupyter-ann") is not None  # nothing changed



MEASURED = """
import os, time, tuner
p = tuner.params()
while not os.path.exists(os.environ["GATE"]):
    time.sleep(0.05)
tuner.report(p["x"])
"""


def test_a_trial_pods_readings_show_in_the_pool_usage_and_metrics(
        kube_env: KubeCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,  # noqa: F811
        standin: StandIn) -> None:  # noqa: F811
    """Issue 26 on a cluster: a GPU trial pod reads its GPU (the NVML stand-in, at 80 %) and
    reports to the tuner service; GET pool shows its utilisation and memory on the trial's
    row, GET usage its used GPU-hours beside the allocated ones, and the scrape (with the
    hub's metrics scope) the pool's gauges under the names one machine exports, and the
    flavor's quota and use."""
    team_queue(kube_env, monkeypatch)
    standin.set({"util": 80, "mem_used": 4 * GiB, "mem_total": 16 * GiB})
    data = kube_env.data_dir
    env = {k: v for k, v in os.environ.items()
           if k.startswith("TUNEHUB_K8S_") or k in ("KUBECONFIG", "TUNEHUB_DATA",
                                                     "TUNEHUB_HOME")}
    env.update(TUNEHUB_BACKENDS="kubernetes", TUNEHUB_GPU_SAMPLE_SECONDS="0.5")
    code = data / "users" / "alice" / "measured"
    code.mkdir(parents=True)
    (code / "train.py").write_text(MEASURED)
    gate = data / "measured-gate"
    spec = {"name": "measured", "code": str(code), "command": "python train.py",
            "metric": "score", "trials": 1, "parallelism": 1, "pruner": "none",
            "space": {"x": {"type": "float", "low": 0, "high": 1}},
            "resources": {"gpu": 1, "gpu_type": "a100", "memory": "1Gi"},
            # The pod loads the NVML stand-in, and this checkout's tuner (its GPU reporter).
            "env": {**standin.env, "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
                    "GATE": str(gate)}}
    with running_tuner_hub(tmp_path, f"sqlite:///{tmp_path / 'tuner.sqlite'}", env) as hub:
        alice = hub.client(hub.token("alice", [READ, "custom:tuner:submit",
                                               "access:services!service=tuner"]))
        r = alice.post("sweeps", json={"spec": spec})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]

        def measured() -> dict[str, Any] | None:
            rows = [g for g in alice.get("pool").json()["gpus"]
                    if (g["holder"] or {}).get("sweep_id") == sid]
            return rows[0] if rows and rows[0]["utilization"] is not None else None
        row = wait_for(measured, timeout=20, what="the trial pod's reading in the pool")
        assert row["utilization"] == pytest.approx(0.8) and row["measure_absent"] is None
        assert row["memory_used_bytes"] == 4 * GiB and row["memory_total_bytes"] == 16 * GiB
        assert row["use"]["ever_busy"] and not row["use"]["unused"] and row["measured_at"]

        def used() -> dict[str, Any] | None:
            usage = alice.get("usage", params={"since": "2026-01-01"}).json()
            return usage if usage["used"]["sweep"].get(str(sid), 0) > 0 else None
        usage = wait_for(used, timeout=20, what="used GPU-hours of the trial pod")
        assert usage["mode"] == "kubernetes" and usage["used_gpu_hours"] > 0
        assert 0 < usage["used"]["person"]["alice"] <= 0.8 * usage["person"]["alice"]

        metrics = f"{hub.url}services/tuner/metrics"
        assert httpx.get(metrics, timeout=30).status_code == 401  # the scope, or nothing
        scrape = httpx.get(metrics, timeout=30,  # the admin's token carries read:metrics
                           headers={"Authorization": f"token {hub.admin_token}"})
        assert scrape.status_code == 200, scrape.text
        page = scrape.text
        assert _metric(page, "tunehub_gpu_held", gpu="a100", kind="trial") == 1.0, page
        assert _metric(page, "tunehub_gpu_held", gpu="a100", kind="notebook") == 0.0
        assert _metric(page, "tunehub_gpu_person_held_gpus", person="alice") == 1.0
        assert _metric(page, "tunehub_gpu_flavor_quota_gpus", flavor="a100") == 2.0
        assert _metric(page, "tunehub_gpu_flavor_used_gpus", flavor="a100") == 1.0
        assert _metric(page, "tunehub_gpu_queue_length", kind="trial") == 0.0
        assert _metric(page, "tunehub_gpu_utilization_ratio", gpu=f"{row['pod']}/0") == 0.8
        assert (_metric(page, "tunehub_gpu_allocated_seconds_total", person="alice",
                        kind="trial") or 0) > 0
        assert (_metric(page, "tunehub_gpu_used_seconds_total", person="alice",
                        kind="trial") or 0) > 0
        gate.write_text("")


NOTEBOOK_SERVERS = """
c.JupyterHub.spawner_class = "jupyterhub.spawner.SimpleLocalProcessSpawner"
c.Spawner.cmd = [sys.executable, "-m", "jupyterhub.singleuser"]
c.Spawner.args = {args}
c.Spawner.environment = {environment}
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
c.JupyterHub.load_roles[1]["scopes"] += ["admin:servers"]
from hub import gpu_reclaim
gpu_reclaim.configure(c, "{{home}}/state")
c.GpuReclaim.sample_seconds = 0.5
"""


def test_a_notebook_pods_gpu_use_reaches_the_pool_and_usage_from_its_servers_reports(
        kube_env: KubeCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,  # noqa: F811
        standin: StandIn) -> None:  # noqa: F811
    """Issue 26 on a cluster, notebooks: ann's GPU notebook (its pod, as the chart's
    KubeSpawner makes it, and its real server, reading its GPU through the NVML stand-in at
    70 %) reports to the hub, as it does for the idle-GPU rule; the tuner reads those reports
    with its own hub token into the pod's holding: GET pool shows the notebook's utilisation and
    memory, GET usage its used GPU-hours beside the allocated ones, the metrics its used
    GPU-seconds."""
    from hub.notebook import SINGLEUSER_ARGS

    team_queue(kube_env, monkeypatch)
    kube_env.create(notebook_pod("ann", kube_env.data_dir / "ann-done"))
    standin.set({"util": 70, "mem_used": 3 * GiB, "mem_total": 16 * GiB})
    env = {k: v for k, v in os.environ.items()
           if k.startswith("TUNEHUB_K8S_") or k in ("KUBECONFIG", "TUNEHUB_DATA",
                                                     "TUNEHUB_HOME")}
    env.update(TUNEHUB_BACKENDS="kubernetes", TUNEHUB_GPU_SAMPLE_SECONDS="0.5")
    args = [*SINGLEUSER_ARGS, *(["--allow-root"] if os.geteuid() == 0 else [])]
    server_env = {**standin.env, "CUDA_VISIBLE_DEVICES": "0",
                  "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    config = NOTEBOOK_SERVERS.format(args=_literal(args), environment=_literal(server_env))
    with running_tuner_hub(tmp_path, f"sqlite:///{tmp_path / 'tuner.sqlite'}", env,
                           extra_config=config) as hub:
        admin = httpx.Client(base_url=f"{hub.url}hub/api/", timeout=60,
                             headers={"Authorization": f"token {hub.admin_token}"})
        assert admin.post("users/ann").status_code == 201
        assert admin.post("users/ann/server").status_code in (201, 202)
        wait_for(lambda: (admin.get("users/ann").json()["servers"].get("") or {}).get("ready"),
                 timeout=120, what="ann's notebook server")
        bob = hub.client(hub.token("bob", [READ]))

        def measured() -> dict[str, Any] | None:
            rows = [g for g in bob.get("pool").json()["gpus"]
                    if (g["holder"] or {}).get("kind") == "notebook"]
            return rows[0] if rows and rows[0]["utilization"] is not None else None
        row = wait_for(measured, timeout=60, what="the notebook's GPU reading in the pool")
        assert row["holder"]["person"] == "ann" and row["measure_absent"] is None
        assert row["utilization"] == pytest.approx(0.7)
        assert row["memory_used_bytes"] == 3 * GiB and row["memory_total_bytes"] == 16 * GiB
        assert row["use"]["ever_busy"] and not row["use"]["unused"]

        def used() -> dict[str, Any] | None:
            usage = bob.get("usage", params={"since": "2026-01-01"}).json()
            return usage if usage["used"]["notebook"].get("ann", 0) > 0 else None
        usage = wait_for(used, timeout=30, what="used GPU-hours of ann's notebook")
        assert 0 < usage["used"]["notebook"]["ann"] <= 0.7 * usage["notebook"]["ann"] * 1.01
        assert usage["used"]["person"]["ann"] == usage["used"]["notebook"]["ann"]

        # Counted once, however often the same report is read: the row's sum grows only with
        # the server's new reports (its last one's time is the hub's).
        ledger = KubeHoldingLedger(Database(f"sqlite:///{tmp_path / 'tuner.sqlite'}"))
        (uid, person, server, gpus, use), = ledger.open_notebooks()
        assert (person, server, gpus) == ("ann", "", 1)
        last = use["gpus"]["0"]["last_at"]
        assert with_report(use, {"at": last, "readings": [use["gpus"]["0"]["last"]]},
                           UsePolicy(), gpus) is None
        # A server's report counts for no more GPUs than its pod holds.
        two = [{**use["gpus"]["0"]["last"], "gpu": g} for g in ("0", "1")]
        assert list(with_report(None, {"at": last + 1, "readings": two}, UsePolicy(),
                                gpus)["gpus"]) == ["0"]

        scrape = httpx.get(f"{hub.url}services/tuner/metrics", timeout=30,
                           headers={"Authorization": f"token {hub.admin_token}"})
        assert scrape.status_code == 200, scrape.text
        assert (_metric(scrape.text, "tunehub_gpu_used_seconds_total", person="ann",
                        kind="notebook") or 0) > 0
        assert admin.delete("users/ann/server").status_code in (202, 204)


def _literal(value: Any) -> str:
    """``value`` as Python source inside a config that is ``str.format``-ed once."""
    return repr(value).replace("{", "{{").replace("}", "}}")


async def pool_page(pool: dict[str, Any], usage: dict[str, Any]) -> dict[str, list[str]]:
    """The rows of the sweeps page's GPU pool tables (``#pool-gpus``, ``#pool-flavors``,
    ``#pool-queue``, ``#pool-shares``) as Chromium renders them from ``pool`` and ``usage``:
    the page's own files, its API answered by these (every other API read an empty list)."""
    from playwright.async_api import Route, async_playwright

    from tests.test_hub_browser import CHROMIUM, CHROMIUM_ARGS

    base = "http://tunehub.test/services/tuner/"
    answers = {"api/v1/pool": pool, "api/v1/usage": usage}

    async def serve(route: Route) -> None:
        path = route.request.url.removeprefix(base).split("?")[0]
        if path == "":
            page = (WEB / "index.html").read_text().replace("{{xsrf_token}}", "x")
            await route.fulfill(body=page, content_type="text/html")
        elif path.startswith("static/") and (WEB / path.removeprefix("static/")).is_file():
            await route.fulfill(path=WEB / path.removeprefix("static/"))
        elif path.startswith("api/v1/"):
            await route.fulfill(json=answers.get(path, []))
        else:
            await route.fulfill(status=404, body="")

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page()
            await page.route(f"{base}**", serve)
            await page.goto(base)
            await page.locator("#pool-flavors tbody tr").first.wait_for(timeout=20_000)
            return {table: await page.locator(f"{table} tbody tr").all_inner_texts()
                    for table in ("#pool-gpus", "#pool-flavors", "#pool-queue",
                                  "#pool-shares")}
        finally:
            await browser.close()


def delete_pod(kube: KubeCluster, name: str) -> None:
    from kubesim.client import HarnessClient

    async def delete() -> None:
        client = HarnessClient(kube.url, "test")
        try:
            await client.delete(f"/api/v1/namespaces/{kube.namespace}/pods/{name}", grace=0)
        finally:
            await client.close()
    kube.emulator.call(delete())


async def test_holdings_that_end_while_no_tuner_watches_are_still_counted(
        kube_env: KubeCluster, tmp_path: Path) -> None:  # noqa: F811
    """A notebook pod deleted while the tuner was down is closed when the next tuner lists the
    pods (``stale``, at that moment); one that started and finished while it was down is
    recorded whole, from the pod's own start and finish."""
    db = Database(f"sqlite:///{tmp_path / 'tuner.sqlite'}")
    settings = KubeSettings.from_env()
    data = kube_env.data_dir

    def rows() -> dict[str, GpuHolding]:
        with db.session() as s:
            return {r.person: r for r in s.query(GpuHolding)}

    first = KubernetesPoolSource(settings, db)
    await first.start()
    try:
        kube_env.create(unqueued(notebook_pod("cy", data / "cy-done")))

        async def cy_open() -> bool:
            return "cy" in rows()
        await eventually(cy_open, 20, "cy's notebook holding to be recorded")
    finally:
        await first.close()
    delete_pod(kube_env, "jupyter-cy")  # while no tuner watches
    quick = unqueued(notebook_pod("dee", data / "dee-done"))
    (data / "dee-done").write_text("")
    kube_env.create(quick)

    async def dee_done() -> bool:
        pod = kube_env.get("pods", "jupyter-dee") or {}
        return (pod.get("status") or {}).get("phase") == "Succeeded"
    await eventually(dee_done, 20, "dee's notebook pod to finish")
    assert rows()["cy"].end is None and "dee" not in rows()

    second = KubernetesPoolSource(settings, db)
    await second.start()
    try:
        async def both_closed() -> bool:
            seen = rows()
            return "dee" in seen and seen["cy"].end is not None
        await eventually(both_closed, 20, "the next tuner to close and record them")
    finally:
        await second.close()
        db.dispose()
    cy, dee = rows()["cy"], rows()["dee"]
    assert cy.stale and cy.end >= cy.start
    assert not dee.stale and dee.end is not None and dee.kind == "notebook" and dee.gpus == 1


def unqueued(pod: dict[str, Any]) -> dict[str, Any]:
    """The notebook pod without Kueue (``kueue.queueNotebooks`` off): the scheduler places
    it directly."""
    for label in (m.QUEUE_LABEL, m.PRIORITY_LABEL):
        pod["metadata"]["labels"].pop(label)
    return pod


def test_a_pods_row_says_why_it_shows_no_figures() -> None:
    """A notebook pod whose server's report was not read yet, a trial pod not measured yet,
    one whose readings stopped, one without NVML: null figures and the reason; a fresh reading
    of two GPUs: their mean utilisation and summed memory."""
    from tunehub_base.gpu_meter import UseMeter, UsePolicy
    from tunehub_base.gpu_usage import GpuReading
    from tuner.pool_sources.kube_use import NOT_MEASURED, NOTEBOOK, pod_use, row_figures

    now, policy = 1000.0, UsePolicy()
    assert row_figures(None, "notebook", now)["measure_absent"] == NOTEBOOK
    assert row_figures(None, "trial", now)["measure_absent"] == NOT_MEASURED
    meters = {g: UseMeter(g, since=now - 10) for g in ("0", "1")}
    for gpu, util in (("0", 0.2), ("1", 0.6)):
        meters[gpu].add(GpuReading(gpu, util, GiB, 8 * GiB, (7,)), now, policy)
    use = pod_use(meters, policy)
    assert use["used_seconds"] == pytest.approx(10 * 0.2 + 10 * 0.6)  # GPU-seconds, summed
    shown = row_figures(use, "trial", now + 1)
    assert shown["utilization"] == pytest.approx(0.4) and shown["measure_absent"] is None
    assert shown["memory_used_bytes"] == 2 * GiB and shown["pids"] == [7]
    old = row_figures(use, "trial", now + 3600)
    assert old["utilization"] is None and "no reading from the pod for over" in old[
        "measure_absent"]
    lost = {"0": UseMeter("0", since=now)}
    lost["0"].add(GpuReading("0", absent="no NVML library"), now, policy)
    assert row_figures(pod_use(lost, policy), "trial", now)["measure_absent"] == (
        "no NVML library")
