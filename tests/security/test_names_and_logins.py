"""#31 item 7: names and logins, and what the service's answers tell another person.

- a sweep's ``promote.model`` is its owner's from submission: nobody else (admins included)
  submits or promotes to it while the sweep runs or after, and of two people claiming a free
  name at the same moment exactly one gets it (on SQLite and PostgreSQL);
- wrong passwords from one client address lock that address out of the account, never the
  owner at their own address, and a forged ``X-Real-Ip`` does not choose the address;
- ``/metrics`` needs a hub token with ``read:metrics``;
- the report route answers a trial that is not running, someone else's, and one that never
  existed alike; the ``code`` check answers the same for a path in someone else's area whether
  it exists or not.
"""

from __future__ import annotations

import re
import threading

import httpx
import pytest
from sqlalchemy import select

from hub.login_throttle import LoginThrottle, client_address
from tests.hub_fixtures import Platform
from tests.polling import wait_for
from tests.security import _request_bounds_fixtures as fixtures
from tests.security._request_bounds_fixtures import Lab

pytestmark = [pytest.mark.slow]

lab = fixtures.lab  # the fixtures, found by pytest under these names
lab_each_db = fixtures.lab_each_db

TAKEN = "is taken by another user"


def test_a_model_name_is_its_owners_from_submission(lab_each_db: Lab) -> None:
    lab = lab_each_db
    promote = {"model": "reserved-name", "policy": "always"}
    sid = lab.running_sweep("namer", promote=promote)
    theirs = {**lab.spec("thief", promote=promote), "code": str(lab.shared)}
    for caller, who in ((lab.bob, "bob"), (lab.boss, "a tuner admin")):
        r = caller.post("sweeps", json={"spec": theirs})
        assert r.status_code == 400, (who, r.text)
        assert r.json()["field"] == "promote.model" and TAKEN in r.json()["error"], r.text
        assert "alice" not in r.text
    # Promoting to it is asking for a version of a model that, to bob, does not exist.
    r = lab.bob.post("models/reserved-name/versions/1/promote", json={"stage": "production"})
    assert r.status_code == 404, r.text
    # The sweep ends without registering anything; the name stays alice's.
    lab.open_gate("namer")
    assert lab.finished(sid) == "completed"
    r = lab.bob.post("sweeps", json={"spec": theirs})
    assert r.status_code == 400 and TAKEN in r.json()["error"], r.text
    r = lab.alice.post("sweeps", json={"spec": lab.spec("again", promote=promote)})
    assert r.status_code == 201, r.text


def test_two_people_claiming_a_free_name_at_once_one_gets_it(lab_each_db: Lab) -> None:
    lab = lab_each_db
    spec = {**lab.spec("race", promote={"model": "raced", "policy": "never"}),
            "code": str(lab.shared)}
    answers: list[httpx.Response] = []
    start = threading.Barrier(2)

    def submit(client: httpx.Client) -> None:
        start.wait()
        answers.append(client.post("sweeps", json={"spec": spec}))

    threads = [threading.Thread(target=submit, args=(c,)) for c in (lab.bob, lab.boss)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.status_code for r in answers) == [201, 400], [r.text for r in answers]
    lab.open_gate("race")


def test_metrics_need_a_token_with_the_metrics_scope(lab: Lab) -> None:
    url = f"{lab.hub.url}services/tuner/metrics"
    r = httpx.get(url, timeout=30)
    assert r.status_code == 401 and "read:metrics" in r.json()["error"], r.text
    r = httpx.get(url, timeout=30, headers=lab.alice.headers)
    assert r.status_code == 403 and "read:metrics" in r.json()["error"], r.text
    r = httpx.get(url, timeout=30, headers={"Authorization": f"Bearer {lab.hub.admin_token}"})
    assert r.status_code == 200 and "tunehub_trials_running" in r.text, r.text


def _trial_id(lab: Lab, sid: int) -> int:
    from tuner.db import Database, Trial

    db = Database(lab.db_url, migrate=False)
    try:
        with db.session() as s:
            return int(s.scalars(select(Trial.id).where(Trial.sweep_id == sid)).one())
    finally:
        db.dispose()


def test_the_report_route_says_the_same_for_not_running_and_not_yours(lab: Lab) -> None:
    sid = lab.running_sweep("reported")
    running = _trial_id(lab, sid)

    def report(trial: int | str) -> tuple[int, str]:
        r = httpx.post(f"{lab.hub.api}trials/{trial}/report", json={"value": 1.0}, timeout=30,
                       headers={"Authorization": "Bearer not-the-trials-token"})
        return r.status_code, r.text

    running_answer = report(running)
    assert running_answer[0] == 401, running_answer
    assert report(running + 1000) == running_answer  # never existed
    assert report("nonsense") == running_answer
    lab.open_gate("reported")
    lab.finished(sid)
    assert report(running) == running_answer  # no longer running


def test_the_code_check_says_nothing_of_what_anothers_area_holds(lab: Lab) -> None:
    users = lab.hub.data / "users"
    hidden = users / "alice" / "hidden-project"
    (users / "bob").mkdir(exist_ok=True)
    link = users / "bob" / "peek"
    link.symlink_to(hidden)

    def answers() -> list[tuple[int, str]]:
        out = []
        for code in (hidden, link):
            r = lab.bob.post("sweeps", json={"spec": {**lab.spec("peek"), "code": str(code)}})
            out.append((r.status_code, r.text))
        return out

    absent = answers()
    hidden.mkdir()
    (hidden / "gated.py").write_text("")
    present = answers()
    assert absent == present, (absent, present)
    assert absent[0][0] == 400 and "not in your area" in absent[0][1]


# --- logins ------------------------------------------------------------------------------


def test_lockouts_of_one_pair_grow_and_touch_no_other_pair() -> None:
    throttle = LoginThrottle(max_failures=3, lockout_seconds=0.3, max_lockout_seconds=10)
    for _ in range(3):
        throttle.failed("alice", "10.0.0.9")
    first = throttle.locked_for("alice", "10.0.0.9")
    assert 0 < first <= 0.3
    assert throttle.locked_for("alice", "10.0.0.1") == 0  # the owner, elsewhere
    assert throttle.locked_for("bob", "10.0.0.9") == 0
    wait_for(lambda: throttle.locked_for("alice", "10.0.0.9") == 0, timeout=5,
             what="the first lockout to end")
    for _ in range(3):
        throttle.failed("alice", "10.0.0.9")
    assert throttle.locked_for("alice", "10.0.0.9") > 0.45  # twice the first
    throttle.succeeded("alice", "10.0.0.9")
    assert throttle.locked_for("alice", "10.0.0.9") == 0


def test_the_login_address_is_the_proxys_entry_not_the_clients_claim() -> None:
    from tornado.httputil import HTTPHeaders, HTTPServerRequest

    claimed = HTTPHeaders({"X-Forwarded-For": "127.0.0.1, 10.0.0.9", "X-Real-Ip": "127.0.0.1"})
    request = HTTPServerRequest(method="POST", uri="/hub/login", headers=claimed)
    assert client_address(request) == "10.0.0.9"  # what the proxy appended
    assert client_address(request, trusted={"10.0.0.9"}) == "127.0.0.1"  # behind a trusted LB


def _login(url: str, password: str, source: str, headers: dict[str, str] | None = None,
           ) -> bool:
    """A browser's login from ``source`` (a loopback address of its own): True if it got in."""
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(base_url=url, timeout=60, transport=transport,
                      headers=headers or {}) as client:
        page = client.get("hub/login")
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page.text)
        assert xsrf, page.text[:2000]
        r = client.post("hub/login", data={"username": "admin", "password": password,
                                           "_xsrf": xsrf.group(1)})
        return r.status_code in (200, 302) and "jupyterhub-session-id" in client.cookies


def test_wrong_passwords_never_lock_the_owner_out(platform: Platform) -> None:
    platform.start()
    assert platform.password, platform.output
    for _ in range(6):  # the attacker, at its own address, claiming the owner's
        assert not _login(platform.url, "wrong-password", "127.0.0.2",
                          {"X-Real-Ip": "127.0.0.1", "X-Forwarded-For": "127.0.0.1"})
    # The attacker's address is locked out of the account, even with the right password ...
    assert not _login(platform.url, platform.password, "127.0.0.2")
    # ... and the owner, at theirs, is not.
    assert _login(platform.url, platform.password, "127.0.0.1")
    hub_log = (platform.home / "hub" / "hub.log").read_text(errors="replace")
    assert "'admin' from 127.0.0.2 refused" in hub_log, hub_log[-3000:]
