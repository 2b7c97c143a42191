"""The service never stalls on one user's long request: while alice's submission (a large code
snapshot, then the database) is in progress, bob's API calls and his running trial's reports are
answered.

To hold alice's submission in progress for as long as the test needs, without timing, the test
locks Optuna's ``studies`` table in PostgreSQL (EXCLUSIVE: reads pass, inserts wait), so alice's
request is stuck in its database step after copying its snapshot. A handler that did that work
on the event loop would freeze every other request until the lock is released; the test shows
the others finish first, then releases the lock and alice's sweep is created."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from tests.conftest import PG_BASE
from tests.polling import wait_for
from tests.service_fixtures import running_tuner_hub

pytestmark = [pytest.mark.slow]

READ_SUBMIT = ["custom:tuner:read", "custom:tuner:submit", "access:services!service=tuner"]
REPORTER = """\
import os, pathlib, time, tuner
sync = pathlib.Path(os.environ["SYNC"])
i = 0
while not (sync / "stop").exists():
    if (sync / f"go-{i}").exists():
        prune = tuner.report(float(i), step=i)
        (sync / f"answered-{i}").write_text(str(prune))
        i += 1
    time.sleep(0.05)
tuner.report(1.0)
"""
SPACE = {"x": {"type": "float", "low": 0, "high": 1}}


def test_other_users_are_answered_during_a_large_submission(
    tmp_path: Path, pg_schema_url: str
) -> None:
    schema = pg_schema_url.rsplit("%3D", 1)[1]
    with running_tuner_hub(tmp_path, pg_schema_url) as hub:
        alice = hub.client(hub.token("alice", READ_SUBMIT))
        bob = hub.client(hub.token("bob", READ_SUBMIT))
        sync = tmp_path / "sync"
        sync.mkdir()
        bobs = hub.data / "users" / "bob" / "reporter"
        bobs.mkdir(parents=True)
        (bobs / "train.py").write_text(REPORTER)
        r = bob.post("sweeps", json={"spec": {
            "name": "reporter", "code": str(bobs), "command": "python train.py", "metric": "m",
            "trials": 1, "space": SPACE, "env": {"SYNC": str(sync)}}})
        assert r.status_code == 201, r.text
        bob_sweep = r.json()["id"]
        wait_for(lambda: [t["state"] for t in bob.get(f"sweeps/{bob_sweep}/trials").json()]
                 == ["running"], timeout=120, what="bob's trial to run")

        # alice's code: 60 MiB in 1,500 files.
        big = hub.data / "users" / "alice" / "big"
        big.mkdir(parents=True)
        (big / "train.py").write_text("import tuner\ntuner.report(1.0)\n")
        for i in range(1500):
            (big / f"blob-{i}.bin").write_bytes(bytes([i % 251]) * (40 * 1024))

        admin = create_engine(PG_BASE, isolation_level="AUTOCOMMIT")
        locker = create_engine(pg_schema_url)
        with locker.connect() as lock, admin.connect() as watch, \
                concurrent.futures.ThreadPoolExecutor(1) as pool:
            lock.execute(text("LOCK TABLE studies IN EXCLUSIVE MODE"))
            submitted = pool.submit(alice.post, "sweeps", json={"spec": {
                "name": "big", "code": str(big), "command": "python train.py", "metric": "m",
                "trials": 1, "space": SPACE}})

            def alice_waits_on_the_lock() -> bool:
                return bool(watch.execute(text(
                    "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE c.relname = 'studies' AND n.nspname = :s AND NOT l.granted"),
                    {"s": schema}).scalar())

            wait_for(alice_waits_on_the_lock, timeout=120,
                     what="alice's submission to reach the database")
            assert len(list((hub.home.parent / "tunehub" / "sweeps").glob(
                ".incoming-*/code/blob-*.bin"))) == 1500  # her snapshot is copied, staged

            # Meanwhile: bob's calls and his trial's reports are answered.
            for step in range(3):
                assert bob.get("sweeps").status_code == 200
                assert bob.get(f"sweeps/{bob_sweep}").json()["state"] == "running"
                (sync / f"go-{step}").touch()
                wait_for((sync / f"answered-{step}").exists, timeout=60,
                         what=f"bob's report {step} to be answered")
            values = bob.get(f"sweeps/{bob_sweep}/trials").json()[0]["intermediate_values"]
            assert [v["step"] for v in values] == [0, 1, 2]
            assert not submitted.done()  # alice's request is still in progress

            lock.rollback()  # release: alice's submission goes through
            r = submitted.result()
            assert r.status_code == 201, r.text
        admin.dispose()
        locker.dispose()
        code_dir = hub.home.parent / "tunehub" / "sweeps" / str(r.json()["id"]) / "code"
        assert len(list(code_dir.glob("blob-*.bin"))) == 1500
        (sync / "stop").touch()
        wait_for(lambda: bob.get(f"sweeps/{bob_sweep}").json()["state"] == "completed",
                 timeout=120, what="bob's sweep to complete")
        assert httpx.get(f"{hub.api}openapi.json", timeout=30).status_code == 200
