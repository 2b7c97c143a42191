"""The tuner service is killed (SIGKILL) under ``tunehub up`` while trials report: the hub
restarts it (JupyterHub restarts a managed service that exits), its controller resumes the
sweep, and every trial is accounted for: each number once, each report once, Optuna's study
equal to ours.

On one machine a trial runs as a child of the service and dies with it (``PR_SET_PDEATHSIG``:
no trial is left reporting into the void, its logs reach the service through pipes it opened):
the restarted service runs it again, same number and parameters, from its last checkpoint.
The trials' reports sent while the service is away are retried by the SDK with backoff.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
from sqlalchemy import func, select

from tests.fault_records import FaultRecord, record
from tests.hub_fixtures import Platform
from tests.polling import wait_for
from tests.test_hub_platform import Hub, login_token
from tunehub_base.process_identity import ProcessIdentity
from tuner.db import Database, SweepRow, TrialReport

pytestmark = [pytest.mark.slow]

TRIALS, PARALLEL, STEPS = 4, 2, 3

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
    os.kill(old.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for(lambda: old.alive() is False, timeout=30, what="the tuner to die")

    # The hub starts it again (it polls its services), and the sweep goes on.
    new = wait_for(lambda: [p for p in tuner_processes(platform.home) if p != old],
                   timeout=180, what="the hub to restart the tuner service")
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
    assert "Service tuner exited" in log, log[-3000:]  # the hub saw it die, and restarted it
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
        seen="API unreachable until the hub restarted the service; the sweep went on; "
             f"the {PARALLEL} running trials ran again (attempt 2), each report counted once"))
