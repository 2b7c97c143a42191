"""The database is down when the tuner service starts (the machine rebooting, a failover in
progress): the service waits for it, says so once, and comes up when it returns, the same
process (the hub does not have to restart it in a loop); a sweep submitted then runs.

A PostgreSQL of the test's own (``tests.test_database_outage``), crashed before the hub starts
its tuner service, and started again once the service has said it waits.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from tests.fault_records import FaultRecord, record
from tests.polling import wait_for
from tests.service_fixtures import running_tuner_hub
from tests.test_database_outage import MESSAGE, Postgres, postgres  # noqa: F401 (a fixture)

READ_SUBMIT = ["custom:tuner:read", "custom:tuner:submit", "access:services!service=tuner"]
TRAIN = "import tuner\np = tuner.params()\ntuner.report(p['x'])\n"


def test_tuner_service_waits_for_the_database_at_start(
    postgres: Postgres, tmp_path: Path  # noqa: F811 (the fixture)
) -> None:
    postgres.crash()
    hub_log = tmp_path / "hub" / "jupyterhub.log"
    timings: dict[str, float] = {}
    failures: list[BaseException] = []

    def start_when_said() -> None:
        """The database comes back once the service has said it waits for it."""
        try:
            wait_for(lambda: hub_log.exists() and MESSAGE in hub_log.read_text(),
                     timeout=120, what="the service to say the database is unreachable")
            timings["said"] = time.monotonic()
            postgres.start()
            timings["back"] = time.monotonic()
        except BaseException as exc:  # (re-raised by the test below)
            failures.append(exc)

    began = time.monotonic()
    restarter = threading.Thread(target=start_when_said)
    restarter.start()
    try:
        with running_tuner_hub(tmp_path, postgres.url) as hub:
            answered = time.monotonic()
            restarter.join(timeout=180)
            assert not failures, failures
            log = hub.log.read_text()
            assert log.count(MESSAGE) == 1, log[-3000:]
            assert "database reachable again" in log, log[-3000:]
            # The same process waited: the hub never saw its service exit.
            assert "Service tuner exited" not in log, log[-3000:]
            assert "Traceback" not in log, log[-3000:]

            alice = hub.client(hub.token("alice", READ_SUBMIT))
            code = hub.data / "code"
            code.mkdir(parents=True)
            (code / "train.py").write_text(TRAIN)
            spec = {"name": "after-start", "code": str(code), "command": "python train.py",
                    "metric": "score", "trials": 2, "parallelism": 2,
                    "space": {"x": {"type": "float", "low": 0, "high": 1}}}
            r = alice.post("sweeps", json={"spec": spec})
            assert r.status_code == 201, r.text
            sweep_id = r.json()["id"]

            def ended() -> dict[str, Any] | None:
                view: dict[str, Any] = alice.get(f"sweeps/{sweep_id}").json()
                return view if view["state"] in ("completed", "failed") else None

            done = wait_for(ended, timeout=300, what="the sweep to end")
            assert done is not None and done["state"] == "completed", done
    finally:
        restarter.join(timeout=180)
    record(FaultRecord(
        fault="database down when the tuner service starts",
        duration_s=round(timings["back"] - began, 1), sweeps=0, trials=0, running=0, lost=0,
        recover_s=round(answered - timings["back"], 1),
        seen="the service's log said once \"database unreachable since …, retrying\" and "
             "that it was back; the same process came up (no crash loop)"))
