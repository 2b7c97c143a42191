"""Several tuners on one database (issue 30): each sweep's controller runs on exactly one of
them, any of them takes a trial's report, and when one dies the others take its sweeps over.

Two real tuner services on one PostgreSQL schema behind one real hub: the hub's own (replica 1)
and a second started with the environment the hub gives its service, on another port
(replica 2). Trials of both report to replica 1's address, as they would to a Kubernetes
Service in front of the replicas, so replica 2's trials' reports are sent on to it by replica
1 (:mod:`tuner.api.report_routing`). Replica 2 is SIGKILLed while its sweeps run; replica 1
takes them over (:func:`tuner.service.keep_adopting`) and every sweep ends with exactly its
trials, each number once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from tests.polling import wait_for
from tests.service_fixtures import free_port, running_tuner_hub
from tests.test_faults_tuner_killed import tuner_processes
from tuner.db import Database, SweepRow, Trial

pytestmark = [pytest.mark.slow]

TRIALS, PARALLEL, STEPS = 3, 2, 3
USER_SCOPES = ["custom:tuner:read", "custom:tuner:submit", "access:services!service=tuner"]

# Step 1, then wait for the test's gate, then the other steps (as in the fault tests).
TRAIN = """
import os, time, tuner
p = tuner.params()
for step in range(1, {steps} + 1):
    if step == 2:
        deadline = time.monotonic() + 900
        while not os.path.exists({gate!r}) and time.monotonic() < deadline:
            time.sleep(0.2)  # the trial waits for the test's gate (a file)
    tuner.report(p["x"] * 10 + step, step=step)
"""


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_two_tuners_share_sweeps_and_one_takes_over_when_the_other_dies(
    tmp_path: Path, pg_schema_url: str,
) -> None:
    with running_tuner_hub(tmp_path, pg_schema_url) as hub:
        (first,) = tuner_processes(Path(hub.env["TUNEHUB_HOME"]))
        env = _environ(first.pid)
        prefix = env["JUPYTERHUB_SERVICE_PREFIX"]
        first_url = env["JUPYTERHUB_SERVICE_URL"].rstrip("/") + prefix
        port = free_port()
        second_url = f"http://127.0.0.1:{port}{prefix}"
        env.update(JUPYTERHUB_SERVICE_URL=f"http://127.0.0.1:{port}",
                   TUNEHUB_TRIAL_API_URL=first_url)
        log = tmp_path / "replica2.log"
        with open(log, "wb") as out:
            second = subprocess.Popen([sys.executable, "-m", "tuner.service"], env=env,
                                      stdout=out, stderr=subprocess.STDOUT)
        try:
            _run(hub, tmp_path, pg_schema_url, first_url, second_url, second, log)
        finally:
            if second.poll() is None:
                second.kill()
            second.wait(30)


def _run(hub: Any, tmp_path: Path, db_url: str, first_url: str, second_url: str,
         second: subprocess.Popen[bytes], log: Path) -> None:
    token = hub.token("ana", USER_SCOPES)
    headers = {"Authorization": f"token {token}"}

    def replica_ready() -> bool:
        if second.poll() is not None:
            raise AssertionError(f"replica 2 exited:\n{log.read_text()[-3000:]}")
        try:
            return httpx.get(f"{second_url}api/v1/openapi.json", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(replica_ready, timeout=120, what="the second tuner replica")
    gate = tmp_path / "gate"
    code = hub.data / "gated"
    code.mkdir(parents=True)
    (code / "train.py").write_text(TRAIN.format(gate=str(gate), steps=STEPS))
    sweeps: dict[int, str] = {}
    for i, base in enumerate([hub.api, hub.api, f"{second_url}api/v1/", f"{second_url}api/v1/"]):
        spec = {"name": f"replicas-{i}", "code": str(code), "command": "python train.py",
                "metric": "score", "trials": TRIALS, "parallelism": PARALLEL,
                "max_retries": 0, "sampler": "random", "pruner": "none",
                "space": {"x": {"type": "float", "low": 0, "high": 1}}}
        r = httpx.post(f"{base}sweeps", json={"spec": spec}, headers=headers, timeout=60)
        assert r.status_code == 201, r.text
        sweeps[r.json()["id"]] = base
    db = Database(db_url, migrate=False)

    def rows() -> tuple[dict[int, SweepRow], list[Trial]]:
        with db.session() as s:
            found = {row.id: row for row in s.scalars(
                select(SweepRow).where(SweepRow.id.in_(sweeps)))}
            return found, list(s.scalars(select(Trial).where(Trial.sweep_id.in_(sweeps))))

    # Each sweep runs on the replica it was submitted to; every running trial's first
    # report landed (replica 2's through replica 1, which sent them on).
    def spread() -> bool:
        found, trials = rows()
        reported = [t for t in trials if t.last_step == 1 and t.state == "running"]
        return len(reported) == PARALLEL * len(sweeps)

    wait_for(spread, timeout=300, what="every sweep's first trials to report")
    found, _ = rows()
    owners = {sid: row.controller_url for sid, row in found.items()}
    assert owners == {sid: (first_url if base == hub.api else second_url)
                      for sid, base in sweeps.items()}

    os.kill(second.pid, signal.SIGKILL)
    second.wait(30)
    on_second = [sid for sid, url in owners.items() if url == second_url]

    # Replica 1 takes replica 2's sweeps over; their trials run again under it.
    wait_for(lambda: all(row.controller_url == first_url for sid, row in rows()[0].items()
                         if sid in on_second), timeout=120, what="replica 1 to take over")
    gate.touch()

    def ended() -> bool:
        return all(row.state.is_finished() for row in rows()[0].values())

    wait_for(ended, timeout=600, what="every sweep to end")
    found, trials = rows()
    for sid, row in found.items():
        mine = [t for t in trials if t.sweep_id == sid]
        assert row.state == "completed", (sid, row.state, row.reason)
        assert sorted(t.number for t in mine) == list(range(TRIALS)), sid
        assert all(t.state == "completed" and t.last_step == STEPS for t in mine), sid
    # The killed replica's trials were run again (attempt 2); the others' were not.
    again = {t.sweep_id for t in trials if t.attempts > 1}
    assert again and again <= set(on_second)
    # A report of a trial this replica does not run, with a wrong token: refused like any
    # other, not sent on.
    r = httpx.post(f"{first_url}api/v1/trials/{trials[0].id}/report",
                   headers={"Authorization": "Bearer nope"}, json={"value": 1, "step": 1},
                   timeout=30)
    assert r.status_code == 401
