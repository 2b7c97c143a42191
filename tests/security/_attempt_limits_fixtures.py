"""One real ``tunehub up`` as root for the attempt-limits attacks: people with Unix users of
their own (alice and bob), small per-person caps, and helpers to submit, watch and record.

Module-scoped (:func:`limits_world`): starting the platform costs most of a test's time, and
these tests each use their own sweeps on it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.hub_fixtures import Platform, system_users_for_test
from tests.polling import wait_for
from tests.service_fixtures import free_port
from tests.test_hub_platform import login_token
from tunehub_base.process_identity import ProcessIdentity

API = "services/tuner/api/v1/"
SPACE = {"x": {"type": "float", "low": 0.0, "high": 1.0}}
#: The caps the platform runs with here: small, so a test reaches them.
CAPS = {"TUNEHUB_MAX_TRIALS": "50", "TUNEHUB_MAX_PARALLELISM": "8",
        "TUNEHUB_MAX_WORKERS_PER_PERSON": "2", "TUNEHUB_ATTEMPT_PIDS": "64"}
FINAL = ("completed", "failed", "cancelled")


@dataclass
class Person:
    """One account: its API client (its own token) and its area of the data store."""

    name: str
    http: httpx.Client
    code: Path

    def submit(self, script: str, name: str, **spec: Any) -> httpx.Response:
        """Submit a sweep running ``script`` (written into the person's code directory)."""
        (self.code / f"{name}.py").write_text(script)
        body = {"name": name, "code": str(self.code), "command": f"python {name}.py",
                "metric": "score", "trials": 1, "parallelism": 1, "space": SPACE,
                "preload": "none", **spec}
        return self.http.post("sweeps", json={"spec": body})

    def run(self, script: str, name: str, **spec: Any) -> int:
        r = self.submit(script, name, **spec)
        assert r.status_code == 201, r.text
        return int(r.json()["id"])

    def trials(self, sweep: int) -> list[dict[str, Any]]:
        r = self.http.get(f"sweeps/{sweep}/trials")
        assert r.status_code == 200, r.text
        return list(r.json())

    def finished(self, sweep: int, timeout: float = 300) -> dict[str, Any]:
        """The sweep once it has ended."""
        def ended() -> dict[str, Any] | None:
            view = self.http.get(f"sweeps/{sweep}").json()
            return view if view["state"] in FINAL else None
        return wait_for(ended, timeout=timeout, what=f"sweep {sweep} to end")

    def log(self, sweep: int, number: int = 0) -> str:
        return self.http.get(f"sweeps/{sweep}/trials/{number}/logs").text


@dataclass
class LimitsWorld:
    platform: Platform
    alice: Person
    bob: Person
    shared: Path  # a directory every person's trials may write (records, gates)


@pytest.fixture(scope="module")
def limits_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LimitsWorld]:
    with system_users_for_test() as (base, unix_env):
        base = base or tmp_path_factory.mktemp("limits")
        home, data = base / "tunehub", base / "data"
        env = {**os.environ, **unix_env, **CAPS, "TUNEHUB_HOME": str(home),
               "TUNEHUB_DATA": str(data), "TUNEHUB_LOCAL_GPUS": "", "TF_CPP_MIN_LOG_LEVEL": "2"}
        env.pop("TUNEHUB_DB_URL", None)
        env.pop("TUNEHUB_API_URL", None)
        port = free_port()
        platform = Platform(f"http://127.0.0.1:{port}/", home, data, env, port)
        try:
            platform.start()
            assert platform.password, platform.output
            admin = login_token(platform.url, "admin", platform.password)
            hub = httpx.Client(base_url=platform.url + "hub/api/", timeout=60,
                               headers={"Authorization": f"token {admin}"})
            r = hub.post("users", json={"usernames": ["alice", "bob"]})
            assert r.status_code == 201, r.text
            shared = data / "shared"
            shared.mkdir(parents=True)
            shared.chmod(0o1777)  # trials run as their owners' system users
            people = []
            for name in ("alice", "bob"):
                r = hub.post(f"users/{name}/tokens", json={"note": "limits test"})
                assert r.status_code == 201, r.text
                code = data / "users" / name / "limits"
                code.mkdir(parents=True)
                people.append(Person(name, httpx.Client(
                    base_url=platform.url + API, timeout=60,
                    headers={"Authorization": f"token {r.json()['token']}"}), code))
            yield LimitsWorld(platform, people[0], people[1], shared)
        finally:
            platform.stop()


def process_gone(pid: int, start_ticks: int) -> bool:
    """The process ``pid`` that started at ``start_ticks`` (``/proc/PID/stat`` field 22) no
    longer runs: gone, a zombie (dead, waiting to be reaped), or the pid reused since."""
    return ProcessIdentity(pid, start_ticks).alive() is False
