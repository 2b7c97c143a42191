"""A privileged process never opens a path a user controls (#31 items 3 and 8).

What a trial leaves in its directory — a link to a root-only secret or to ``/proc/self/environ``
where its log or a worker's log is, a FIFO there, links and FIFOs inside the model it saves, a
directory on the model's path swapped for a link, a 1-byte ``saved_model.pb`` — must never reach
the logs API, the registry, or stall the tuner. The registry's intake is checked directly on
real files (both modes share it); the logs and the whole path end to end as root on a real
``tunehub up`` with per-person Unix users, the attacker acting with its own token.
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Home
from tests.hub_fixtures import Platform
from tests.polling import wait_for
from tests.sweeps_helpers import MINIMAL_SAVED_MODEL, parse_json, write_sweep
from tests.test_hub_platform import login_token
from tuner.db import Database
from tuner.serving.intake import ModelRefused
from tuner.serving.registry import Registry

API = "services/tuner/api/v1/"


# --- the registry's intake, on real files ----------------------------------------------------


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    return Registry(Database(f"sqlite:///{tmp_path / 'tunehub.sqlite'}"), tmp_path / "models")


@pytest.fixture
def secret(tmp_path: Path) -> bytes:
    """A root-only file's content (as the tuner's token or the hub's secret would be)."""
    value = secrets.token_hex(16).encode()
    path = tmp_path / "secret"
    path.write_bytes(value)
    path.chmod(0o600)
    return value


def a_model(top: Path) -> Path:
    """``top/trial/artifacts/model``, a SavedModel as a trial saves it."""
    model = top / "trial" / "artifacts" / "model"
    (model / "variables").mkdir(parents=True)
    (model / "saved_model.pb").write_bytes(MINIMAL_SAVED_MODEL)
    (model / "variables" / "variables.index").write_bytes(b"weights")
    return model


def register(registry: Registry, source: Path, trusted: Path) -> Any:
    return registry.register(model="m", source_dir=source, owner="alice", metric="acc",
                             direction="maximize", metric_value=0.5, trusted=trusted)


def registry_bytes(root: Path) -> bytes:
    """Everything the registry holds, as one blob (links and all: nothing may point out)."""
    out = b""
    for path in sorted(root.rglob("*")):
        assert not path.is_symlink(), path
        if path.is_file():
            out += path.read_bytes()
    return out


def test_a_model_is_copied_whole_and_checked(registry: Registry, tmp_path: Path) -> None:
    source = a_model(tmp_path / "sweeps")
    row = register(registry, source, tmp_path / "sweeps")
    copied = Path(row.path)
    assert (copied / "saved_model.pb").read_bytes() == MINIMAL_SAVED_MODEL
    assert (copied / "variables" / "variables.index").read_bytes() == b"weights"


@pytest.mark.parametrize("where", ["x", "variables/variables.data-00000-of-00001",
                                   "saved_model.pb", "variables"])
def test_a_link_to_a_secret_is_refused_not_copied(
    registry: Registry, tmp_path: Path, secret: bytes, where: str
) -> None:
    source = a_model(tmp_path / "sweeps")
    target = source / where
    if target.is_dir():
        os.rename(target, source / "moved")
    else:
        target.unlink(missing_ok=True)
    target.symlink_to(tmp_path / "secret" if where != "variables" else tmp_path)
    with pytest.raises(ModelRefused, match=f"{where} is a symbolic link"):
        register(registry, source, tmp_path / "sweeps")
    assert secret not in registry_bytes(registry.root)
    assert list((registry.root / "m").iterdir()) == []  # the staging copy is gone too


def test_a_directory_swapped_for_a_link_on_the_way_is_not_followed(
    registry: Registry, tmp_path: Path, secret: bytes
) -> None:
    """``artifacts`` (a directory the trial owns) replaced by a link to a tree of the
    attacker's choosing, holding a well-formed model beside a copy of the secret: nothing on
    the path below the platform's own directory is followed."""
    elsewhere = a_model(tmp_path / "elsewhere")
    (elsewhere / "leak").write_bytes(secret)
    trial = tmp_path / "sweeps" / "trial"
    trial.mkdir(parents=True)
    (trial / "artifacts").symlink_to(elsewhere.parent)
    with pytest.raises(ModelRefused, match="trial/artifacts is not a directory"):
        register(registry, trial / "artifacts" / "model", tmp_path / "sweeps")
    assert secret not in registry_bytes(registry.root)


@pytest.mark.parametrize("where", ["saved_model.pb", "variables/variables.index"])
def test_a_fifo_in_a_model_is_refused_without_waiting(
    registry: Registry, tmp_path: Path, where: str
) -> None:
    source = a_model(tmp_path / "sweeps")
    (source / where).unlink()
    os.mkfifo(source / where)
    outcome: list[BaseException | None] = []

    def attempt() -> None:
        try:
            register(registry, source, tmp_path / "sweeps")
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            outcome.append(exc)

    worker = threading.Thread(target=attempt, daemon=True)  # a hang must not hang pytest
    worker.start()
    wait_for(lambda: outcome, timeout=10, what="the registry to give up on the FIFO")
    assert isinstance(outcome[0], ModelRefused) and f"{where} is a FIFO" in str(outcome[0])


@pytest.mark.parametrize("content", [b"x", b"", b"\x08\x01", b"\x08\x01\x12\x02\x12\x00",
                                     b"\x12\xff\xff\xff\x0f"])
def test_what_is_not_a_saved_model_is_refused_with_the_reason(
    registry: Registry, tmp_path: Path, content: bytes
) -> None:
    source = a_model(tmp_path / "sweeps")
    (source / "saved_model.pb").write_bytes(content)
    with pytest.raises(ModelRefused, match="saved_model.pb .*not a SavedModel"):
        register(registry, source, tmp_path / "sweeps")
    assert registry.list_models() == []


def test_a_model_above_the_cap_is_refused(
    registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = a_model(tmp_path / "sweeps")
    monkeypatch.setenv("TUNEHUB_MODEL_MAX_BYTES", str(len(MINIMAL_SAVED_MODEL) + 3))
    with pytest.raises(ModelRefused, match="TUNEHUB_MODEL_MAX_BYTES"):
        register(registry, source, tmp_path / "sweeps")
    monkeypatch.setenv("TUNEHUB_MODEL_MAX_BYTES", str(len(MINIMAL_SAVED_MODEL) + 7))
    assert register(registry, source, tmp_path / "sweeps").version == 1


# --- one Unix account for everyone: the trial may replace the tuner's log itself -------------

SELF_FIFO = """
import os, sys
os.unlink("trial.log")
os.mkfifo("trial.log")
sys.exit(3)
"""


def test_a_trial_that_swaps_its_own_log_for_a_fifo_cannot_stall_its_sweep(
    sqlite_home: Home, tmp_path: Path
) -> None:
    """Without per-person users the trial runs as the tuner does and can replace ``trial.log``
    with a FIFO. The failure's log tail, the next attempt's header and its log must then not
    wait on it: the sweep ends, and the retry says why it could not run."""
    path = write_sweep(tmp_path / "code", SELF_FIFO, trials=1, parallelism=1, max_retries=1)
    out = sqlite_home.cli("sweep", "run", str(path), "--wait", "--json", timeout=240)
    view = parse_json(out.stdout)
    assert view["state"] == "failed", (view, out.stderr)
    (trial,) = view["trials_detail"]
    assert trial["attempts"] == 2 and "cannot write its log" in trial["reason"], trial


# --- end to end: a second person's trials against the root tuner ------------------------------

#: Runs as alice's Unix user, as two workers (TF_CONFIG). It plants what the tuner used to
#: follow: the names of this and the next attempts' worker logs as links to the secret or to
#: ``/proc/self/environ`` (read by root: the tuner's environment), and each worker tries to
#: put such a link in ``trial.log``'s place. Its model holds links to both. The first attempt
#: fails on purpose so that the second starts among what the first planted.
PLANTER = """
import json, os, pathlib, sys, tuner
index = json.loads(os.environ.get("TF_CONFIG", '{"task": {"index": 0}}'))["task"]["index"]
secret, attempt = os.environ["SECRET"], int(os.environ["TUNEHUB_TRIAL_ATTEMPT"])
target = secret if index == 0 else "/proc/self/environ"
for a in range(attempt, attempt + 3) if index == 0 else ():  # the chief plants, alone
    name = f"attempt-{a}.worker-1.log"
    try:
        os.unlink(name)
    except OSError:
        pass
    os.symlink(secret if a % 2 else "/proc/self/environ", name)
try:
    os.symlink(target, f"trial.log.{index}.{attempt}")
    os.replace(f"trial.log.{index}.{attempt}", "trial.log")
    print("trial.log: REPLACED")
except PermissionError:
    print(f"trial.log: kept by worker {index}")
print(f"worker {index} of attempt {attempt} says hello", flush=True)
if attempt == 1:
    sys.exit(3)
if tuner.is_chief():
    model = pathlib.Path(os.environ["TUNEHUB_ARTIFACT_DIR"]) / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "saved_model.pb").write_bytes(MODEL)
    os.symlink(secret, model / "x")
    os.symlink("/proc/self/environ", model / "environ")
tuner.report(1.0)
"""

#: Puts FIFOs where logs and model files are, then waits for the test's gate while the tuner
#: must keep answering everyone.
FIFOS = """
import json, os, pathlib, time, tuner
index = json.loads(os.environ.get("TF_CONFIG", '{"task": {"index": 0}}'))["task"]["index"]
for name in ("attempt-1.worker-1.log", "attempt-1.worker-2.log", "trial.log"):
    try:
        os.unlink(name)
    except OSError:
        pass
    try:
        os.mkfifo(name)
    except OSError as exc:
        print(f"{name}: {exc.strerror}")
if tuner.is_chief():
    model = pathlib.Path(os.environ["TUNEHUB_ARTIFACT_DIR"]) / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "saved_model.pb").write_bytes(MODEL)
    os.mkfifo(model / "pipe")
print(f"worker {index} planted its FIFOs", flush=True)
while not os.path.exists(os.environ["GATE"]):
    time.sleep(0.1)
tuner.report(1.0)
"""

ONE_BYTE = """
import os, pathlib, tuner
model = pathlib.Path(os.environ["TUNEHUB_ARTIFACT_DIR"]) / "model"
model.mkdir(parents=True, exist_ok=True)
(model / "saved_model.pb").write_bytes(b"x")
tuner.report(1.0)
"""


class Person:
    """One account's view of the tuner's API, with its own token."""

    def __init__(self, platform: Platform, token: str) -> None:
        self.http = httpx.Client(base_url=platform.url + API, timeout=10,
                                 headers={"Authorization": f"token {token}"})

    def get(self, path: str, status: int = 200) -> Any:
        r = self.http.get(path)
        assert r.status_code == status, (path, r.status_code, r.text)
        return r.json() if "json" in r.headers.get("content-type", "") else r.text

    def submit(self, code: Path, name: str, script: str, **extra: Any) -> int:
        (code / f"{name}.py").write_text(script.replace("MODEL", repr(MINIMAL_SAVED_MODEL)))
        spec = {"name": name, "code": str(code), "command": f"python {name}.py",
                "metric": "score", "trials": 1, "parallelism": 1,
                "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}}, **extra}
        r = self.http.post("sweeps", json={"spec": spec})
        assert r.status_code == 201, r.text
        return int(r.json()["id"])

    def ended(self, sweep_id: int) -> Any:
        view = self.get(f"sweeps/{sweep_id}")
        return view if view["state"] in ("completed", "failed", "cancelled") else None


@pytest.fixture
def people(platform: Platform) -> Iterator[dict[str, Person]]:
    """alice (the attacker) and bob (everyone else), each with a token of their own."""
    assert os.geteuid() == 0, "this test needs root (the suite runs as root on this machine)"
    platform.start()
    assert platform.password, platform.output
    hub = httpx.Client(base_url=platform.url + "hub/api/", timeout=60, headers={
        "Authorization": f"token {login_token(platform.url, 'admin', platform.password)}"})
    assert hub.post("users", json={"usernames": ["alice", "bob"]}).status_code == 201
    out = {}
    for name in ("alice", "bob"):
        r = hub.post(f"users/{name}/tokens", json={"note": "no-follow test"})
        assert r.status_code == 201, r.text
        out[name] = Person(platform, r.json()["token"])
    yield out


@pytest.mark.slow
def test_planted_links_and_fifos_reach_neither_the_logs_nor_the_registry(
    platform: Platform, people: dict[str, Person]
) -> None:
    alice, bob, workers = people["alice"], people["bob"], 2
    secret = secrets.token_hex(16)
    secret_path = platform.home / "root-only-secret"
    secret_path.write_text(secret)
    secret_path.chmod(0o600)
    code = platform.data / "users" / "alice" / "attacks"
    code.mkdir(parents=True, exist_ok=True)
    gates = platform.data / "gates"
    gates.mkdir()
    gates.chmod(0o777)
    resources = {"workers": workers}
    planted = alice.submit(code, "planter", PLANTER, max_retries=1, resources=resources,
                           env={"SECRET": str(secret_path)},
                           promote={"model": "alice-planted", "policy": "always"})
    fifos = alice.submit(code, "fifos", FIFOS, resources=resources,
                         env={"GATE": str(gates / "open")},
                         promote={"model": "alice-fifos", "policy": "always"})
    one_byte = alice.submit(code, "onebyte", ONE_BYTE,
                            promote={"model": "alice-one-byte", "policy": "always"})

    # While the FIFO trial waits at its gate, its FIFOs are in place: everyone is answered.
    def fifos_planted() -> bool:  # the chief's output is in the log as it prints it
        r = alice.http.get(f"sweeps/{fifos}/trials/0/logs")
        return r.status_code == 200 and "worker 0 planted its FIFOs" in r.text

    wait_for(fifos_planted, timeout=240, what="the FIFO trial to plant its FIFOs")
    for _ in range(3):
        assert isinstance(bob.get("sweeps"), list)
        view = alice.get(f"sweeps/{fifos}")
        assert view["state"] == "running", (view, alice.get(f"sweeps/{fifos}/trials"))
    (gates / "open").touch()

    views = {sid: wait_for(lambda s=sid: alice.ended(s), timeout=300, what=f"sweep {sid}")
             for sid in (planted, fifos, one_byte)}
    assert isinstance(bob.get("sweeps"), list)  # still answering after the FIFO trial ended

    # Links: the logs carry what the workers printed (through the tuner's pipes), never the
    # secret or the tuner's environment; trial.log itself could not be replaced.
    log = alice.get(f"sweeps/{planted}/trials/0/logs")
    assert views[planted]["state"] == "completed", (views[planted], log)
    for w in range(workers):
        assert f"worker {w} of attempt 2 says hello" in log, log
        assert f"trial.log: kept by worker {w}" in log, log
    assert "REPLACED" not in log and secret not in log, log
    assert "JUPYTERHUB_API_TOKEN" not in log and "TUNEHUB_DB_URL" not in log, log
    versions = alice.get("models/alice-planted")
    assert [v["stage"] for v in versions] == ["production"], versions
    registry = Path(versions[0]["path"]).parent.parent
    held = registry_bytes(registry)
    assert secret.encode() not in held and b"JUPYTERHUB_API_TOKEN" not in held

    # FIFOs: the sweep ended normally; its model (the FIFO dropped when its artifacts were
    # sealed, refused anywhere else) holds no FIFO.
    assert views[fifos]["state"] == "completed", views[fifos]
    fifo_log = alice.get(f"sweeps/{fifos}/trials/0/logs")
    assert "trial.log: File exists" in fifo_log, fifo_log  # not removable: not replaced
    assert all(f"worker {i} planted its FIFOs" in fifo_log for i in range(workers)), fifo_log
    assert len(alice.get("models/alice-fifos")) == 1

    # A 1-byte saved_model.pb: the sweep completes, says why nothing was registered.
    assert views[one_byte]["state"] == "completed", views[one_byte]
    assert "not a SavedModel" in (views[one_byte]["reason"] or ""), views[one_byte]
    alice.get("models/alice-one-byte", status=404)
