"""The digits sweep with ``--backend kubernetes`` end to end, through the real CLI, against the
API emulator: every trial is a Job whose pod (a local process) trains a real Keras model,
reports over HTTP to the CLI's tuner API, and the best model is registered and promoted."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from kubesim import KubeCluster
from tests.conftest import REPO
from tests.polling import wait_for
from tests.sweeps_helpers import kube_cli_home, parse_json, run_on_kubernetes, write_sweep

pytestmark = pytest.mark.slow

DIGITS = REPO / "examples" / "digits"


def finished(proc: subprocess.Popen[str]) -> dict:
    """The JSON a ``--wait --json`` CLI run prints once it exits (it must exit 0)."""
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out + err
    return dict(parse_json(out))


def test_digits_sweep_on_kubernetes_promotes_a_model(kube: KubeCluster, tmp_path: Path) -> None:
    home = kube_cli_home(kube, tmp_path, TUNEHUB_K8S_GPU_TYPES=json.dumps(
        [{"name": "t4", "product": "Tesla-T4", "generation": 1, "maxPerNode": 4}]))
    spec = yaml.safe_load((DIGITS / "sweep.yaml").read_text())
    spec.update(trials=2, parallelism=2, code=str(DIGITS), pruner="none",
                env={"DIGITS_EPOCHS": "2", "TF_CPP_MIN_LOG_LEVEL": "2"})
    sweep = run_on_kubernetes(home, spec, tmp_path)
    jobs = kube.objects("jobs", label_selector=f"tunehub.io/sweep={sweep['id']}")
    assert jobs == []  # cleaned up with the sweep
    trials = sweep["trials_detail"]
    assert [t["state"] for t in trials] == ["completed", "completed"], trials
    assert all(t["attempts"] == 1 and t["has_model"] for t in trials), trials
    creates = kube.counters.snapshot()
    # One Job per trial, plus the server-side dry run of check() at submission.
    assert creates[("create", "jobs")] == 3 and creates[("create", "secrets")] == 2
    versions = parse_json(home.cli("model", "show", "digits", "--json", check=True).stdout)
    assert [v["version"] for v in versions] == [1]
    assert versions[0]["stage"] == "production"
    assert (Path(versions[0]["path"]) / "saved_model.pb").is_file()
    log = home.cli("sweep", "logs", str(sweep["id"]), "0", check=True).stdout
    assert "attempt 1" in log and "val_accuracy" in log, log


GATED = """
import os, time, tuner
p = tuner.params()
while not os.path.exists(os.environ["GATE"]):
    time.sleep(0.1)
tuner.report(p["x"])
"""


def test_killed_tuner_resumes_without_duplicate_jobs(kube: KubeCluster, tmp_path: Path) -> None:
    """SIGKILL the controller while its trials' Jobs run; ``sweep resume`` finishes the sweep
    and at no moment does one trial have two live Jobs."""
    gate = kube.data_dir / "gate"
    home = kube_cli_home(kube, tmp_path)
    spec = write_sweep(tmp_path / "code", GATED, trials=2, parallelism=2, max_retries=1,
                       env={"GATE": str(gate)}, resources={"cpu": 0.1, "memory": "256Mi"})

    def live_jobs() -> dict[str, list[str]]:
        by_trial: dict[str, list[str]] = {}
        for job in kube.objects("jobs", label_selector="app.kubernetes.io/managed-by=tunehub"):
            if not job["metadata"].get("deletionTimestamp"):
                by_trial.setdefault(job["metadata"]["labels"]["tunehub.io/trial"], []).append(
                    job["metadata"]["name"])
        return by_trial

    first = home.popen("sweep", "run", str(spec), "--backend", "kubernetes", "--wait")
    try:
        def both_running() -> bool:
            pods = kube.objects("pods", label_selector="app.kubernetes.io/managed-by=tunehub")
            return len([p for p in pods if p["status"].get("phase") == "Running"]) == 2

        wait_for(both_running, 60, "both trial pods to run")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    assert len(live_jobs()) == 2  # the Jobs outlive the tuner

    resumed = home.popen("sweep", "resume", "1", "--wait", "--json")
    try:
        def relaunched() -> bool:
            jobs = live_jobs()
            assert all(len(names) == 1 for names in jobs.values()), jobs  # never two
            return sorted(n for names in jobs.values() for n in names) == [
                "tunehub-s1-t1-a2", "tunehub-s1-t2-a2"]

        wait_for(relaunched, 60, "the resumed controller's attempts")
        gate.write_text("")
        sweep = finished(resumed)
    finally:
        if resumed.poll() is None:
            resumed.kill()
    assert sweep["state"] == "completed" and sweep["completed"] == 2, sweep
    assert kube.objects("jobs") == []


async def test_restarted_service_adopts_running_jobs(
        kube: KubeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tuner service restarts (same report URL) while its trials' Jobs run: the new
    controller adopts those Jobs instead of rerunning them, and their results count."""
    import asyncio

    from tornado.httpserver import HTTPServer

    from kubesim.waiting import eventually
    from tests.service_fixtures import free_port
    from tunehub_base.settings import load_settings
    from tuner.api import make_app
    from tuner.backends import make_backend
    from tuner.db import Database, Trial
    from tuner.scheduling.host import SweepHost
    from tuner.spec import SweepSpec
    from tuner.sweep_store import SweepStore, local_actor

    # The chart's tuner identity and cluster set-up, as for the CLI sweeps.
    monkeypatch.setenv("KUBECONFIG", kube_cli_home(kube, tmp_path).extra_env["KUBECONFIG"])
    data, gate = kube.data_dir, kube.data_dir / "gate"
    monkeypatch.setenv("TUNEHUB_HOME", str(data / ".tunehub"))
    monkeypatch.setenv("TUNEHUB_DATA", str(data))
    monkeypatch.setenv("TUNEHUB_DB_URL", f"sqlite:///{tmp_path / 't.sqlite'}")
    settings = load_settings().ensure_dirs()
    db = Database(settings.db_url)
    spec = SweepSpec.from_yaml(write_sweep(
        tmp_path / "code", GATED, trials=2, parallelism=2, max_retries=0,
        env={"GATE": str(gate)}, resources={"cpu": 0.1, "memory": "256Mi"}))
    sweep_id = (await asyncio.to_thread(
        SweepStore(db, settings).submit, spec, local_actor(),
        make_backend("kubernetes", settings))).id
    port = free_port()

    async def service() -> tuple[SweepHost, HTTPServer]:
        """What ``python -m tuner.service`` builds: an engine reachable at a fixed URL."""
        backend = make_backend("kubernetes", settings)
        engine = SweepHost(db, settings, {"kubernetes": backend}, f"http://127.0.0.1:{port}/",
                        stable_api_url=True)
        server = HTTPServer(make_app(engine))
        server.listen(port, "127.0.0.1")
        await engine.start()
        return engine, server

    def job_names() -> list[str]:
        return sorted(j["metadata"]["name"] for j in kube.objects(
            "jobs", label_selector="app.kubernetes.io/managed-by=tunehub"))

    first, server = await service()
    first.run_sweep(sweep_id)

    async def both_running() -> bool:
        pods = kube.objects("pods", label_selector="app.kubernetes.io/managed-by=tunehub")
        return len([p for p in pods if p["status"].get("phase") == "Running"]) == 2

    await eventually(both_running, 60, "both trial pods to run")
    await first.close()  # the service stops (SIGTERM); its Jobs keep running
    server.stop()
    assert job_names() == ["tunehub-s1-t1-a1", "tunehub-s1-t2-a1"]

    second, server = await service()
    try:
        task = second.run_sweep(sweep_id)

        async def adopted() -> bool:
            controller = second.controllers.get(sweep_id)
            return controller is not None and len(controller.running) == 2

        await eventually(adopted, 60, "the restarted controller to adopt both attempts")
        gate.write_text("")
        assert await asyncio.wait_for(task, 120) == "completed"
    finally:
        await second.close()
        server.stop()
    creates = kube.counters.snapshot()
    assert creates[("create", "jobs")] == 3  # the dry run at submission + one per trial
    with db.session() as s:
        from sqlalchemy import select

        trials = list(s.scalars(select(Trial).where(Trial.sweep_id == sweep_id)))
        assert [(t.state, t.attempts) for t in trials] == [("completed", 1), ("completed", 1)]
        assert all(t.value is not None for t in trials)


def test_trials_wait_for_the_namespace_quota_and_the_user_sees_why(
        kube: KubeCluster, tmp_path: Path) -> None:
    """The namespace's quota holds one trial at a time: the second trial waits (it does not
    fail or use up a retry), ``sweep show`` says it waits for the quota, and it runs once the
    first trial frees the quota."""
    home = kube_cli_home(kube, tmp_path)
    kube.create({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "sweeps"},
                 "spec": {"hard": {"requests.cpu": "1"}}})
    gate = kube.data_dir / "gate"
    spec = write_sweep(tmp_path / "code", GATED, trials=2, parallelism=2, max_retries=0,
                       env={"GATE": str(gate)}, resources={"cpu": 1, "memory": "256Mi"})
    run = home.popen("sweep", "run", str(spec), "--backend", "kubernetes", "--wait", "--json")
    try:
        def one_waits() -> dict | None:
            shown = home.cli("sweep", "show", "1", "--json")
            if shown.returncode != 0:
                return None
            trials = parse_json(shown.stdout)["trials_detail"]
            waiting = [t for t in trials if (t["reason"] or "").startswith("waiting")]
            return waiting[0] if waiting and len(trials) == 2 else None

        waiting = wait_for(one_waits, 90, "a trial to wait for the quota")
        assert waiting["state"] == "running" and waiting["attempts"] == 1, waiting
        assert "exceeded quota: sweeps, requested: requests.cpu=1, used: requests.cpu=1, " \
               "limited: requests.cpu=1" in waiting["reason"], waiting
        text = home.cli("sweep", "show", "1", check=True).stdout
        assert f"trial {waiting['number']} running: waiting: the cluster does not create its " \
               "pod yet: pods" in text, text
        gate.write_text("")
        sweep = finished(run)
    finally:
        if run.poll() is None:
            run.kill()
    assert sweep["state"] == "completed", sweep
    trials = sweep["trials_detail"]
    assert [(t["state"], t["attempts"], t["reason"]) for t in trials] == [
        ("completed", 1, None), ("completed", 1, None)], trials
