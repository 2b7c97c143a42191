"""The tuner service is killed (SIGKILL) under ``tunehub up`` while trials report: its keeper
(:mod:`tuner.keeper`, the hub's managed service) starts it again at once, its controller resumes
the sweep, and every trial is accounted for: each number once, each report once, Optuna's study
equal to ours.

On one machine a trial runs as a child of the service and dies with it (``PR_SET_PDEATHSIG``:
no trial is left reporting into the void, its logs reach the service through pipes it opened):
the restarted service runs it again, same number and parameters, from its last checkpoint.
The trials' reports sent while the service is away are retried by the SDK with backoff.

On Kubernetes (the emulator over real HTTP) a trial is a Job, not the service's child: it runs
on through the kill, and the restarted service adopts it (no Job created again, one attempt per
trial) and takes its later reports.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import optuna
import pytest
from sqlalchemy import func, select

from kubesim import KubeCluster
from tests.fault_records import FaultRecord, record
from tests.hub_fixtures import Platform, parent_of
from tests.polling import wait_for
from tests.service_fixtures import running_tuner_hub
from tests.sweeps_helpers import kube_cli_home
from tests.test_hub_platform import Hub, login_token
from tunehub_base.process_identity import ProcessIdentity
from tuner.db import Database, SweepRow, TrialReport

pytestmark = [pytest.mark.slow]

TRIALS, PARALLEL, STEPS = 4, 2, 3
READ_SUBMIT = ["custom:tuner:read", "custom:tuner:submit", "access:services!service=tuner"]

# Step 1, then wait for the test's gate (so trials are surely running when the service is
# killed), then the other steps. Each report leaves a mark first: NUMBER-ATTEMPT-STEP.
TRAIN = """
import os, time, tuner
p = tuner.params()
mark = os.path.join({record!r}, os.environ["TUNEHUB_TRIAL_NUMBER"] + "-"
                    + os.environ["TUNEHUB_TRIAL_ATTEMPT"])
for step in range(1, {steps} + 1):
    if step == 2:
        deadline = time.monotonic() + 900
        while not os.path.exists({gate!r}) and time.monotonic() < deadline:
            time.sleep(0.2)  # the trial waits for the test's gate (a file)
    open(f"{{mark}}-{{step}}", "w").close()
    tuner.report(p["x"] * 10 + step, step=step)
"""


def tuner_processes(home: Path) -> list[ProcessIdentity]:
    """The tuner services of this platform (their environment names its home); not a child
    the service forked for a trial that has not yet become the trial's command."""
    found: dict[int, ProcessIdentity] = {}
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            if b"tuner.service" not in cmdline:
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
            if f"TUNEHUB_HOME={home}".encode() in environ:
                pid = int(entry.name)
                status = (entry / "status").read_text()
                parents[pid] = int(status.split("PPid:")[1].split()[0])
                found[pid] = ProcessIdentity.of(pid)
        except (OSError, ProcessLookupError, IndexError, ValueError):
            continue
    return [ident for pid, ident in found.items() if parents[pid] not in found]


def submit_gated_sweep(platform: Platform, hub: Hub, name: str, record_dir: Path,
                       gate: Path) -> str:
    """The admin's sweep of ``TRIALS`` gated trials, ``PARALLEL`` at a time, each marking its
    reports in ``record_dir`` and waiting for ``gate``; returns its API path."""
    code = platform.data / "gated"
    code.mkdir(parents=True)
    (code / "train.py").write_text(TRAIN.format(record=str(record_dir), gate=str(gate),
                                                steps=STEPS))
    spec = {"name": name, "code": str(code), "command": "python train.py",
            "metric": "score", "trials": TRIALS, "parallelism": PARALLEL, "max_retries": 0,
            "sampler": "random", "space": {"x": {"type": "float", "low": 0, "high": 1}}}
    sweep = hub.call("POST", "services/tuner/api/v1/sweeps", 201, json={"spec": spec})
    return f"services/tuner/api/v1/sweeps/{sweep['id']}"


def test_tuner_killed_under_tunehub_up_loses_nothing(platform: Platform) -> None:
    base = platform.home.parent
    record_dir, gate = base / "record", base / "gate"
    record_dir.mkdir(mode=0o777)
    record_dir.chmod(0o777)  # the trials run as the person's own Unix user (as root)
    platform.start()
    assert platform.password, platform.output
    hub = Hub(platform.url, login_token(platform.url, "admin", platform.password))
    api = submit_gated_sweep(platform, hub, "killed", record_dir, gate)

    def marks() -> set[str]:
        return {p.name for p in record_dir.iterdir()}

    # Both running trials have sent their first report (it landed: the trial went on to wait).
    wait_for(lambda: sum(m.endswith("-1") for m in marks()) >= PARALLEL, timeout=300,
             what="two trials running and reporting")
    wait_for(lambda: sum(bool(t["last_step"]) for t in hub.call("GET", f"{api}/trials", 200))
             >= PARALLEL, timeout=120, what="their first reports to land")
    (old,) = tuner_processes(platform.home)
    keeper = parent_of(old.pid)
    os.kill(old.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for(lambda: old.alive() is False, timeout=30, what="the tuner to die")

    # Its keeper (tuner.keeper, the hub's managed service) starts it again at once, and the
    # sweep goes on.
    new = wait_for(lambda: [p for p in tuner_processes(platform.home) if p != old],
                   timeout=180, what="the keeper to restart the tuner service")
    assert [parent_of(p.pid) for p in new] == [keeper]
    wait_for(platform._tuner_ready, timeout=180, what="the restarted tuner to answer")
    restarted_at = time.monotonic()
    gate.touch()
    def ended() -> dict[str, Any] | None:
        view: dict[str, Any] = hub.call("GET", api, 200)
        return view if view["state"] in ("completed", "failed") else None

    done = wait_for(ended, timeout=600, what="the sweep to end")
    resumed_s = restarted_at - killed_at
    assert done is not None and done["state"] == "completed", done

    trials = hub.call("GET", f"{api}/trials", 200)
    assert sorted(t["number"] for t in trials) == list(range(TRIALS)), trials
    assert all(t["state"] == "completed" for t in trials), trials
    for t in trials:  # each step once, whatever attempt sent it
        assert sorted(r["step"] for r in t["intermediate_values"]) == list(range(1, STEPS + 1)), t
    # The trials the kill interrupted ran again as the same trial (a second attempt), not as
    # new trials; the others ran once.
    assert sum(t["attempts"] == 2 for t in trials) == PARALLEL, trials
    assert all(t["attempts"] in (1, 2) for t in trials), trials
    log = (platform.home / "hub" / "hub.log").read_text(errors="replace")
    assert re.search(r"the tuner service stopped unexpectedly after \d+ s, killed by SIGKILL "
                     r"\(out of memory\?\); starting it again", log), log[-3000:]
    assert "Service tuner exited" not in log, log[-3000:]  # the hub's service never stopped
    assert len(new) == 1, new  # one service again, not two

    db = Database(f"sqlite:///{platform.home}/tunehub.sqlite", migrate=False)
    try:
        with db.session() as s:
            row = s.get(SweepRow, int(api.rsplit("/", 1)[1]))
            assert row is not None
            study_name = row.study_name
            reports = s.execute(select(func.count()).select_from(TrialReport)).scalar_one()
        assert reports == TRIALS * STEPS
        study = optuna.load_study(study_name=study_name, storage=db.url)
        assert len(study.trials) == TRIALS
        assert {t.number: t.value for t in study.trials} == {
            t["number"]: t["value"] for t in trials}
        for ot in study.trials:
            assert sorted(ot.intermediate_values) == list(range(1, STEPS + 1)), ot
    finally:
        db.dispose()
    record(FaultRecord(
        fault="tuner service SIGKILLed under `tunehub up`",
        duration_s=round(resumed_s, 1), sweeps=1, trials=TRIALS, running=PARALLEL, lost=0,
        recover_s=round(resumed_s, 1),
        seen="API unreachable until the keeper started the service again; the sweep went on; "
             f"the {PARALLEL} running trials ran again (attempt 2), each report counted once"))


def test_tuner_killed_on_kubernetes_adopts_the_running_jobs(
        kube: KubeCluster, tmp_path: Path) -> None:
    """The tuner service (Kubernetes backend, against the API emulator over HTTP) is SIGKILLed
    while its trials' Jobs run and report. On Kubernetes a trial is a Job, not the service's
    child: it keeps running. The service is started again (here by the hub, as its Deployment
    would restart its pod) on the same address; the new controller adopts the running Jobs
    instead of creating them again, and the reports the trials send after the restart land:
    each trial one attempt, each step once, Optuna's study equal to ours."""
    cli_home = kube_cli_home(kube, tmp_path)  # the chart's RBAC, PriorityClasses, identity
    data = kube.data_dir
    home = data / ".tunehub"  # the chart's layout: the home inside the data volume
    env = {"TUNEHUB_BACKENDS": "kubernetes", "KUBECONFIG": cli_home.extra_env["KUBECONFIG"],
           "TUNEHUB_DATA": str(data), "TUNEHUB_HOME": str(home)}
    record_dir, gate = data / "record", data / "gate"
    record_dir.mkdir(parents=True)
    record_dir.chmod(0o777)  # the trials' pods run as a non-root user
    db_url = f"sqlite:///{tmp_path / 'tuner.sqlite'}"
    with running_tuner_hub(tmp_path, db_url, env) as hub:
        alice = hub.client(hub.token("alice", READ_SUBMIT))
        code = data / "users" / "alice" / "gated"
        code.mkdir(parents=True)
        (code / "train.py").write_text(TRAIN.format(record=str(record_dir), gate=str(gate),
                                                    steps=STEPS))
        spec = {"name": "killed-kube", "code": str(code), "command": "python train.py",
                "metric": "score", "trials": TRIALS, "parallelism": PARALLEL,
                "max_retries": 0, "sampler": "random",
                "resources": {"cpu": 0.1, "memory": "256Mi"},
                "space": {"x": {"type": "float", "low": 0, "high": 1}}}
        r = alice.post("sweeps", json={"spec": spec})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]

        def first_reports() -> bool:
            trials = alice.get(f"sweeps/{sid}/trials").json()
            return sum(bool(t["last_step"]) for t in trials) >= PARALLEL

        wait_for(first_reports, timeout=300, what="two trials running and reporting")
        creates = kube.counters.snapshot()[("create", "jobs")]
        running_jobs = sorted(j["metadata"]["name"] for j in kube.objects(
            "jobs", label_selector=f"tunehub.io/sweep={sid}"))
        assert len(running_jobs) == PARALLEL, running_jobs
        (old,) = tuner_processes(home)
        os.kill(old.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        wait_for(lambda: old.alive() is False, timeout=30, what="the tuner to die")
        new = wait_for(lambda: [p for p in tuner_processes(home) if p != old], timeout=180,
                       what="the tuner service to be started again")
        wait_for(lambda: _answers(hub.api), timeout=180, what="the restarted tuner to answer")
        restarted_at = time.monotonic()
        # The Jobs ran on meanwhile: the same ones, none created again.
        assert sorted(j["metadata"]["name"] for j in kube.objects(
            "jobs", label_selector=f"tunehub.io/sweep={sid}")) == running_jobs
        gate.touch()  # the trials go on and report to the new service

        def ended() -> dict[str, Any] | None:
            view: dict[str, Any] = alice.get(f"sweeps/{sid}").json()
            return view if view["state"] in ("completed", "failed") else None

        done = wait_for(ended, timeout=600, what="the sweep to end")
        trials = alice.get(f"sweeps/{sid}/trials").json()
        log = hub.log.read_text(errors="replace")
    assert done is not None and done["state"] == "completed", done
    assert len(new) == 1, new
    assert "Service tuner exited" in log, log[-3000:]
    assert sorted(t["number"] for t in trials) == list(range(TRIALS)), trials
    assert all(t["state"] == "completed" for t in trials), trials
    # Adopted, not run again: every trial one attempt, one Job each (and the dry run at
    # submission); the Jobs running at the kill were created before it, the rest after.
    assert all(t["attempts"] == 1 for t in trials), trials
    assert kube.counters.snapshot()[("create", "jobs")] == 1 + TRIALS
    assert creates == 1 + PARALLEL
    for t in trials:  # each step once
        assert sorted(r["step"] for r in t["intermediate_values"]) == list(range(1, STEPS + 1)), t
    # The adopted trials' later reports were sent after the restart, and landed (above).
    marks = {p.name for p in record_dir.iterdir()}
    assert marks == {f"{n}-1-{s}" for n in range(TRIALS) for s in range(1, STEPS + 1)}, marks

    db = Database(db_url, migrate=False)
    try:
        with db.session() as s:
            row = s.get(SweepRow, sid)
            assert row is not None
            study_name = row.study_name
            reports = s.execute(select(func.count()).select_from(TrialReport)).scalar_one()
        assert reports == TRIALS * STEPS
        study = optuna.load_study(study_name=study_name, storage=db.url)
        assert {t.number: t.value for t in study.trials} == {
            t["number"]: t["value"] for t in trials}
        for ot in study.trials:
            assert sorted(ot.intermediate_values) == list(range(1, STEPS + 1)), ot
    finally:
        db.dispose()
    record(FaultRecord(
        fault="tuner service SIGKILLed on Kubernetes (emulator), Jobs running",
        duration_s=round(restarted_at - killed_at, 1), sweeps=1, trials=TRIALS,
        running=PARALLEL, lost=0, recover_s=round(restarted_at - killed_at, 1),
        seen="API unreachable until the service was started again; its controller adopted "
             f"the {PARALLEL} running Jobs (no Job created again, one attempt each), their "
             "later reports landed, each once"))


def _answers(api: str) -> bool:
    try:
        return httpx.get(f"{api}openapi.json", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False
