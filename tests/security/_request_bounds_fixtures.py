"""A real hub with the tuner service behind its proxy (``tests.service_fixtures``), with small
request bounds so the attacks stay cheap, and the callers the attacks need: two people (alice
and bob), a tuner admin (boss), and a sweep of alice's whose trial runs until a gate opens."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.polling import wait_for
from tests.service_fixtures import TunerHub, running_tuner_hub

#: The service's body bound in these tests (TUNEHUB_API_MAX_BODY).
MAX_BODY = 1024 * 1024
SCOPES = ["custom:tuner:read", "custom:tuner:submit"]
GATED = """\
import os, pathlib, time, tuner
p = tuner.params()
gate = pathlib.Path(os.environ["GATE"])
while not gate.exists():
    time.sleep(0.1)
tuner.report(p["x"])
"""
SPACE = {"x": {"type": "float", "low": 0.0, "high": 1.0}}


@dataclass
class Lab:
    hub: TunerHub
    db_url: str
    alice: httpx.Client
    bob: httpx.Client
    boss: httpx.Client
    code: Path  # alice's code, with the gated script, in her area of the data store
    gates: Path
    shared: Path  # the same script where everyone may take code from


    def spec(self, name: str, **extra: Any) -> dict[str, Any]:
        """Alice's gated sweep (``code`` in ``extra`` for anyone else's)."""
        gate = self.gates / name
        return {"name": name, "code": str(self.code), "command": "python gated.py",
                "metric": "score", "trials": 1, "parallelism": 1, "space": SPACE,
                "env": {"GATE": str(gate)}, **extra}

    def running_sweep(self, name: str, **extra: Any) -> int:
        """A sweep of alice's whose one trial is running (until :meth:`open_gate`)."""
        r = self.alice.post("sweeps", json={"spec": self.spec(name, **extra)})
        assert r.status_code == 201, r.text
        sid = int(r.json()["id"])
        wait_for(lambda: [t["state"] for t in self.alice.get(f"sweeps/{sid}/trials").json()]
                 == ["running"], timeout=120, what=f"sweep {sid}'s trial to run")
        return sid

    def open_gate(self, name: str) -> None:
        (self.gates / name).touch()

    def finished(self, sid: int) -> str:
        return wait_for(lambda: (s := self.alice.get(f"sweeps/{sid}").json()["state"])
                        in ("completed", "failed", "cancelled") and s, timeout=120,
                        what=f"sweep {sid} to end")


def open_lab(tmp_path: Path, db_url: str) -> Iterator[Lab]:
    with running_tuner_hub(tmp_path, db_url, {"TUNEHUB_API_MAX_BODY": str(MAX_BODY)}) as hub:
        code = hub.data / "users" / "alice" / "probe"
        code.mkdir(parents=True)
        (code / "gated.py").write_text(GATED)
        gates = hub.data / "gates"
        gates.mkdir()
        gates.chmod(0o777)
        shared = hub.data / "shared" / "probe"
        shared.mkdir(parents=True)
        (shared / "gated.py").write_text(GATED)
        boss = hub.token("boss", [*SCOPES, "custom:tuner:admin"])
        with hub.client(hub.token("alice", SCOPES)) as alice, \
                hub.client(hub.token("bob", SCOPES)) as bob, hub.client(boss) as admin:
            yield Lab(hub, db_url, alice, bob, admin, code, gates, shared)


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    """On SQLite: the bounds and answers under test do not depend on the database."""
    yield from open_lab(tmp_path, f"sqlite:///{tmp_path / 'tunehub.sqlite'}")


@pytest.fixture
def lab_each_db(tmp_path: Path, db_url: str) -> Iterator[Lab]:
    """On SQLite and on PostgreSQL: where a rule rests on the database (a name's claim)."""
    yield from open_lab(tmp_path, db_url)
