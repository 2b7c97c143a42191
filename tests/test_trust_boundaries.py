"""Who may touch what, on a real ``tunehub up``: every route naming a sweep, trial, log or
model × every sweep state × every kind of caller, and the objects checked afterwards.

Sweeps in each state, all owned by alice:

- ``queued``: submitted, its controller not started yet (the CLI's first step);
- ``running``: run by the service, its trial really running (waiting on a gate file);
- ``cancelling``: run by a CLI controller that is paused (SIGSTOP) after alice asked to cancel,
  so it stays cancelling while we probe;
- ``completed`` (with a registered model), ``failed``, ``cancelled``: run by the service.

Callers: the owner, another user, a tuner admin (hub group ``tuner-admins``), no token, a hub
token without tuner scopes, and a trial's token. Another user gets 404 and nothing changes: the
running sweep still completes when its gate opens (a cancel that reached its controller would
have cancelled it), the cancelling one is still cancelling, the model keeps its stage.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.hub_fixtures import Platform
from tests.polling import wait_for
from tests.sweeps_helpers import MINIMAL_SAVED_MODEL
from tests.test_hub_platform import login_token

pytestmark = [pytest.mark.slow]

API = "services/tuner/api/v1/"
GATED = """\
import os, pathlib, time, tuner
p = tuner.params()
out = os.environ.get("TOKEN_OUT")
if out:
    pathlib.Path(out).write_text(os.environ["TUNEHUB_TRIAL_TOKEN"] + " " +
                                 os.environ["TUNEHUB_TRIAL_ID"])
gate = pathlib.Path(os.environ["GATE"])
while not gate.exists():
    time.sleep(0.1)
tuner.report(p["x"])
"""
QUICK = f"""\
import os, pathlib, tuner
model = pathlib.Path(os.environ["TUNEHUB_ARTIFACT_DIR"]) / "model"
model.mkdir(parents=True, exist_ok=True)
(model / "saved_model.pb").write_bytes({MINIMAL_SAVED_MODEL!r})
tuner.report(0.5)
"""
FAILING = "import sys\nsys.exit(3)\n"
SPACE = {"x": {"type": "float", "low": 0.0, "high": 1.0}}

STATES = ("queued", "running", "cancelling", "completed", "failed", "cancelled")
CALLERS = ("owner", "other", "admin", "anonymous", "no-scopes", "trial")


def spec(code: Path, name: str, command: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "code": str(code), "command": command, "metric": "score",
            "trials": 1, "parallelism": 1, "space": SPACE, **extra}


class Caller:
    def __init__(self, url: str, headers: dict[str, str]) -> None:
        self.http = httpx.Client(base_url=url + API, headers=headers, timeout=60)

    def __call__(self, method: str, path: str, **kw: Any) -> httpx.Response:
        return self.http.request(method, path, **kw)


@pytest.fixture
def world(platform: Platform, tmp_path: Path) -> Iterator[dict[str, Any]]:
    platform.start()
    assert platform.password, platform.output
    admin_token = login_token(platform.url, "admin", platform.password)
    hub = httpx.Client(base_url=platform.url + "hub/api/", timeout=60,
                       headers={"Authorization": f"token {admin_token}"})
    r = hub.post("users", json={"usernames": ["alice", "bob", "boss", "carol"]})
    assert r.status_code == 201, r.text
    for group, user in (("tuner-admins", "boss"), ("tuner-priority", "carol")):
        r = hub.post(f"groups/{group}/users", json={"users": [user]})
        assert r.status_code == 200, r.text

    def token(user: str, scopes: list[str] | None = None) -> str:
        body: dict[str, Any] = {"note": "trust test"}
        if scopes is not None:
            body["scopes"] = scopes
        r = hub.post(f"users/{user}/tokens", json=body)
        assert r.status_code == 201, r.text
        return str(r.json()["token"])

    code = platform.data / "users" / "alice" / "probe"
    code.mkdir(parents=True)
    (code / "gated.py").write_text(GATED)
    (code / "quick.py").write_text(QUICK)
    (code / "failing.py").write_text(FAILING)
    gates = platform.data / "gates"
    gates.mkdir()
    gates.chmod(0o777)  # trials may run as their owner's system user (tunehub up as root)
    alice = Caller(platform.url, {"Authorization": f"token {token('alice')}"})

    def submit(body: dict[str, Any]) -> int:
        r = alice("POST", "sweeps", json={"spec": body})
        assert r.status_code == 201, r.text
        return int(r.json()["id"])

    def state_of(sid: int) -> str:
        return str(alice("GET", f"sweeps/{sid}").json()["state"])

    def trial_running(sid: int) -> bool:
        trials = alice("GET", f"sweeps/{sid}/trials").json()
        if trials and trials[0]["state"] in ("failed", "cancelled", "completed"):
            raise AssertionError(f"sweep {sid}'s trial ended: {trials[0]}\n"
                                 + alice("GET", f"sweeps/{sid}/trials/0/logs").text[-2000:]
                                 + "\nthe hub's log (the tuner's with it):\n"
                                 + platform.hub_log())
        return bool(trials) and trials[0]["state"] == "running"

    sweeps: dict[str, int] = {}
    # completed, with a model; failed.
    sweeps["completed"] = submit(spec(code, "done", "python quick.py",
                                      promote={"model": "alice-model", "policy": "always"}))
    sweeps["failed"] = submit(spec(code, "broken", "python failing.py"))
    # running: the service's controller, its trial waiting on a gate; it hands us its token.
    token_file = platform.data / "gates" / "token"
    # One retry each: what this test probes is who may touch a sweep in each state, so an
    # attempt lost to a fault of the machine (the zygote's log says which, should it happen)
    # is run again rather than failing the probe; the trial's state is still what is asserted.
    sweeps["running"] = submit(spec(code, "gated", "python gated.py", max_retries=1, env={
        "GATE": str(gates / "running"), "TOKEN_OUT": str(token_file)}))
    # cancelled: really running, then cancelled by alice.
    sweeps["cancelled"] = submit(spec(code, "stopped", "python gated.py", max_retries=1,
                                      env={"GATE": str(gates / "cancelled")}))
    wait_for(lambda: trial_running(sweeps["cancelled"]), timeout=300, what="a trial to run")
    assert alice("POST", f"sweeps/{sweeps['cancelled']}/cancel").status_code == 200
    # queued and cancelling: submitted as the CLI does (no controller yet).
    from tunehub_base.settings import load_settings
    from tuner.backends import make_backend
    from tuner.db import Database
    from tuner.spec import SweepSpec
    from tuner.sweep_store import Actor, SweepStore

    settings = load_settings(platform.env)
    db = Database(settings.db_url)
    store = SweepStore(db, settings)
    for state in ("queued", "cancelling"):
        sweep = store.submit(
            SweepSpec.from_dict(spec(code, state, "python gated.py",
                                     env={"GATE": str(gates / state)})),
            Actor("alice"), make_backend("local", settings), confined=True)
        sweeps[state] = sweep.id
    cli_env = {**platform.env, "TUNEHUB_USER": "alice"}
    cli_env.pop("TUNEHUB_API_URL", None)
    controller = subprocess.Popen(
        [sys.executable, "-m", "tuner.cli", "sweep", "resume", str(sweeps["cancelling"]),
         "--wait", "--quiet"], env=cli_env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: trial_running(sweeps["cancelling"]), timeout=300,
                 what="the CLI controller's trial to run")
        os.kill(controller.pid, signal.SIGSTOP)
        assert alice("POST", f"sweeps/{sweeps['cancelling']}/cancel").json()["state"] == \
            "cancelling"
        wait_for(lambda: trial_running(sweeps["running"]), timeout=300,
                 what="the service's trial to run")
        for state in ("completed", "failed", "cancelled"):
            wait_for(lambda s=state: state_of(sweeps[s]) == s, timeout=300,
                     what=f"the {state} sweep")
        trial_token, trial_id = token_file.read_text().split()
        callers = {
            "owner": alice,
            "other": Caller(platform.url, {"Authorization": f"token {token('bob')}"}),
            "admin": Caller(platform.url, {"Authorization": f"token {token('boss')}"}),
            "anonymous": Caller(platform.url, {}),
            "no-scopes": Caller(platform.url, {
                "Authorization": f"token {token('alice', ['read:users:name!user=alice'])}"}),
            "trial": Caller(platform.url, {"Authorization": f"token {trial_token}"}),
            "carol": Caller(platform.url, {"Authorization": f"token {token('carol')}"}),
        }
        yield {"sweeps": sweeps, "callers": callers, "gates": gates, "code": code,
               "trial_token": trial_token, "trial_id": int(trial_id), "controller": controller,
               "platform": platform, "store": store}
    finally:
        for state in STATES:
            (gates / state).touch()
        if controller.poll() is None:
            os.kill(controller.pid, signal.SIGCONT)
            controller.terminate()
            controller.wait(timeout=60)
        db.dispose()


SWEEP_ROUTES = (
    ("GET", "sweeps/{id}"),
    ("GET", "sweeps/{id}/trials"),
    ("GET", "sweeps/{id}/trials/0/logs"),
    ("POST", "sweeps/{id}/cancel"),
    ("POST", "sweeps/{id}/resume"),
)
MODEL_ROUTES = (
    ("GET", "models/alice-model"),
    ("POST", "models/alice-model/versions/1/promote"),
)


def expected(caller: str, method: str) -> int | None:
    """The answer for callers who may not act; None for the owner and admins (per route)."""
    return {"other": 404, "anonymous": 401, "no-scopes": 403, "trial": 401}.get(caller)


def snapshot(owner: Caller, sid: int) -> tuple[Any, ...]:
    view = owner("GET", f"sweeps/{sid}").json()
    trials = owner("GET", f"sweeps/{sid}/trials").json()
    return (view["state"], view["reason"], view["completed"], view["failed"],
            view["model_version_id"], [(t["state"], t["attempts"]) for t in trials])


def test_every_route_every_state_every_caller(world: dict[str, Any]) -> None:
    sweeps, callers = world["sweeps"], world["callers"]
    owner, admin = callers["owner"], callers["admin"]
    before = {state: snapshot(owner, sid) for state, sid in sweeps.items()}
    assert before["running"][0] == "running"
    assert [state for state, _ in before["running"][5]] == ["running"]
    assert before["cancelling"][0] == "cancelling"
    assert before["queued"][0] == "queued" and before["queued"][5] == []
    model_before = owner("GET", "models/alice-model").json()
    assert [v["stage"] for v in model_before] == ["production"]

    # Everyone who may not act, on every route and state, including the writes.
    failures = []
    for caller in ("other", "anonymous", "no-scopes", "trial"):
        for state, sid in sweeps.items():
            for method, route in SWEEP_ROUTES:
                r = callers[caller](method, route.format(id=sid), json={})
                if r.status_code != expected(caller, method) or "error" not in r.json():
                    failures.append((caller, state, method, route, r.status_code, r.text))
                elif caller == "other" and r.json()["error"] != f"sweep {sid} not found":
                    failures.append((caller, state, route, "leaks", r.text))
        for method, route in MODEL_ROUTES:
            r = callers[caller](method, route, json={"stage": "canary"})
            if r.status_code != expected(caller, method):
                failures.append((caller, "model", method, route, r.status_code, r.text))
        # The lists hold nothing of alice's.
        r = callers[caller]("GET", "sweeps")
        assert r.status_code == 200 and r.json() == [] if caller == "other" else \
            r.status_code == expected(caller, "GET"), (caller, r.text)
        r = callers[caller]("GET", "models")
        assert r.status_code == 200 and r.json() == [] if caller == "other" else \
            r.status_code == expected(caller, "GET"), (caller, r.text)
    assert not failures, "\n".join(map(str, failures))

    # Nothing changed: same states, same trials, the model's stage kept.
    after = {state: snapshot(owner, sid) for state, sid in sweeps.items()}
    assert after == before
    assert owner("GET", "models/alice-model").json() == model_before

    # The owner and an admin read every sweep in every state.
    for who in (owner, admin):
        for state, sid in sweeps.items():
            for method, route in SWEEP_ROUTES[:3]:
                r = who(method, route.format(id=sid))
                want = 404 if state == "queued" and route.endswith("logs") else 200
                assert r.status_code == want, (state, route, r.text)
        assert {s["id"] for s in who("GET", "sweeps").json()} == set(sweeps.values())
        assert who("GET", "models/alice-model").status_code == 200

    # Writes by those who may: state rules, not ownership, decide.
    for state in ("completed", "failed", "cancelled"):
        sid = sweeps[state]
        for who in (owner, admin):
            for action in ("cancel", "resume"):
                r = who("POST", f"sweeps/{sid}/{action}")
                if (state, action) == ("cancelled", "cancel"):  # idempotent: answered as it is
                    assert r.status_code == 200 and r.json()["state"] == state, r.text
                else:
                    assert r.status_code == 409, (state, action, r.text)
        assert snapshot(owner, sid) == before[state]
    r = admin("POST", f"sweeps/{sweeps['cancelling']}/cancel")
    assert r.status_code == 200 and r.json()["state"] == "cancelling", r.text
    r = owner("POST", f"sweeps/{sweeps['cancelling']}/resume")
    assert r.status_code == 409 and "being run by process" in r.json()["error"], r.text
    r = owner("POST", f"sweeps/{sweeps['running']}/resume")
    assert r.status_code == 200 and r.json()["state"] == "running", r.text
    r = owner("POST", "models/alice-model/versions/1/promote", json={"stage": "canary"})
    assert r.status_code == 200 and r.json()["stage"] == "canary", r.text
    r = admin("POST", "models/alice-model/versions/1/promote", json={"stage": "production"})
    assert r.status_code == 200 and r.json()["stage"] == "production", r.text

    # Trial tokens: stored only as a hash; valid for their own trial only.
    from tuner.db import Trial
    from tuner.sweep_store import Actor

    store, trial_token = world["store"], world["trial_token"]
    with store.db.session() as s:
        row = s.get(Trial, world["trial_id"])
        assert row is not None and row.token_hash == hashlib.sha256(
            trial_token.encode()).hexdigest()
    r = owner("POST", f"sweeps/{sweeps['queued']}/resume")  # a second trial in the service
    assert r.status_code == 200 and r.json()["state"] == "running", r.text
    # The resumed controller asks for the trial once its study is loaded (in a thread): the
    # list may still be empty on the first look.
    wait_for(lambda: [t["state"] for t in owner("GET", f"sweeps/{sweeps['queued']}/trials").json()
                      ][:1] == ["running"], timeout=120, what="the resumed sweep's trial to run")
    other_trial = store.trial(sweeps["queued"], 0, Actor("admin", admin=True)).id
    report = httpx.post(
        f"{world['platform'].url}{API}trials/{other_trial}/report",
        headers={"Authorization": f"Bearer {trial_token}"}, json={"value": 1.0}, timeout=30)
    assert report.status_code == 401, report.text

    # The running sweep's controller was never told to stop: opened, it completes.
    (world["gates"] / "running").touch()
    done = wait_for(lambda: (v := owner("GET", f"sweeps/{sweeps['running']}").json())
                    ["state"] in ("completed", "failed", "cancelled") and v,
                    timeout=120, what="the running sweep to finish")
    assert done["state"] == "completed" and done["completed"] == 1, done
    # Its token died with its attempt.
    report = httpx.post(
        f"{world['platform'].url}{API}trials/{world['trial_id']}/report",
        headers={"Authorization": f"Bearer {world['trial_token']}"}, json={"value": 1.0},
        timeout=30)
    assert report.status_code == 401, report.text  # as another's: tuner.api.trials.refused

    # The resumed (once queued) sweep: its owner cancels it.
    r = owner("POST", f"sweeps/{sweeps['queued']}/cancel")
    assert r.status_code == 200 and r.json()["state"] in ("cancelling", "cancelled"), r.text
    wait_for(lambda: owner("GET", f"sweeps/{sweeps['queued']}").json()["state"] == "cancelled",
             timeout=60, what="the resumed sweep to be cancelled")

    # The paused CLI controller, let go, honours the cancel it was asked for.
    os.kill(world["controller"].pid, signal.SIGCONT)
    wait_for(lambda: owner("GET", f"sweeps/{sweeps['cancelling']}").json()["state"]
             == "cancelled", timeout=60, what="the cancelling sweep to be cancelled")


def test_model_names_code_paths_and_priority(world: dict[str, Any]) -> None:
    """Model names are one namespace that names no owner; code comes only from the caller's
    part of the data store; priority: high only for the hub group (and admins)."""
    callers, code = world["callers"], world["code"]
    bob = callers["other"]
    # bob cannot tell alice's model from one that does not exist ...
    mine, nothing = bob("GET", "models/alice-model"), bob("GET", "models/no-such-model")
    assert (mine.status_code, nothing.status_code) == (404, 404)
    assert mine.json()["error"] == "model alice-model not found"
    # ... and a sweep promoting to the taken name is refused at submission, naming no owner.
    r = bob("POST", "sweeps", json={"spec": spec(code, "mine", "python quick.py",
                                                 promote={"model": "alice-model"})})
    assert r.status_code == 400 and r.json()["field"] == "promote.model", r.text
    assert "alice" not in r.json()["error"].replace("alice-model", ""), r.text
    # Nor may bob snapshot alice's area of the data store, or anything outside it.
    for where in (code, world["platform"].home / "sweeps", Path("/etc")):
        r = bob("POST", "sweeps", json={"spec": spec(where, "mine", "python quick.py")})
        assert r.status_code == 400 and r.json()["field"] == "code", r.text
    assert bob("GET", "sweeps").json() == []

    # priority: high: refused for bob with the rule, accepted for carol (hub group).
    quick = spec(code, "urgent", "python quick.py", priority="high")
    r = bob("POST", "sweeps", json={"spec": quick})
    assert r.status_code == 403 and "priority: high is for tuner admins and members of the " \
        "hub group" in r.json()["error"], r.text
    assert bob("GET", "sweeps").json() == []
    carols = world["platform"].data / "users" / "carol" / "p"
    carols.mkdir(parents=True)
    (carols / "quick.py").write_text(QUICK)
    urgent = {"spec": spec(carols, "urgent", "python quick.py", priority="high")}
    key = {"Idempotency-Key": "urgent-1"}
    r = world["callers"]["carol"]("POST", "sweeps", json=urgent, headers=key)
    assert r.status_code == 201 and r.json()["spec"]["priority"] == "high", r.text
    # The same request again (its answer lost) is answered with the same sweep, not a second;
    # a key that is no key is refused by name.
    again = world["callers"]["carol"]("POST", "sweeps", json=urgent, headers=key)
    assert again.status_code == 201 and again.json()["id"] == r.json()["id"], again.text
    assert len(world["callers"]["carol"]("GET", "sweeps").json()) == 1
    bad = world["callers"]["carol"]("POST", "sweeps", json=urgent,
                                    headers={"Idempotency-Key": "k" * 65})
    assert bad.status_code == 400 and bad.json()["field"] == "Idempotency-Key", bad.text
    # A spec's env cannot place itself on GPUs.
    r = world["callers"]["carol"]("POST", "sweeps", json={"spec": spec(
        carols, "sneaky", "python quick.py", env={"CUDA_VISIBLE_DEVICES": "0"})})
    assert r.status_code == 400 and r.json()["field"] == "env.CUDA_VISIBLE_DEVICES", r.text
