"""One machine, many people: with ``tunehub up`` as root each account's notebook server and
trials run as its own system user, and the operating system refuses everything that is not
theirs: another person's files and processes, the hub's secrets, the accounts file, the tuner's
database. Their sweeps still run, report and promote; deleting an account stops its servers and
trials and leaves its files."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest
from tornado.httpclient import HTTPRequest
from tornado.ioloop import IOLoop
from tornado.websocket import websocket_connect

from tests.hub_fixtures import Platform
from tests.polling import wait_for
from tests.test_hub_platform import Hub, login_token
from tunehub_base.unix_users import RETIRED_SHELL, UnixUsers
from tuner.cli.errors import CliError
from tuner.cli.isolation import SHARED_NOTE, decide

pytestmark = [pytest.mark.slow]


async def _execute(url: str, user: str, token: str, code: str, timeout: float) -> str:
    """Run ``code`` in a new kernel of ``user``'s server over the Jupyter REST + websocket
    API, as JupyterLab does; returns what it printed, fails on an error."""
    base = f"{url}user/{user}/api/kernels"
    headers = {"Authorization": f"token {token}"}
    async with httpx.AsyncClient(timeout=60, headers=headers) as client:
        r = await client.post(base, json={"name": "python3"})
        assert r.status_code == 201, r.text
        kernel = r.json()["id"]
    ws = await websocket_connect(HTTPRequest(base.replace("http", "ws", 1)
                                             + f"/{kernel}/channels", headers=headers))
    ws.write_message(json.dumps({
        "header": {"msg_id": "cell", "msg_type": "execute_request", "username": user,
                   "session": "test", "version": "5.3", "date": ""},
        "parent_header": {}, "metadata": {}, "buffers": [], "channel": "shell",
        "content": {"code": code, "silent": False, "store_history": False,
                    "user_expressions": {}, "allow_stdin": False},
    }))
    out: list[str] = []
    replied = idle = False
    loop = IOLoop.current()
    deadline = loop.time() + timeout
    while not (replied and idle):  # the reply (shell) and the end of the outputs (iopub)
        raw = await ws.read_message()
        assert raw is not None, "the kernel's websocket closed"
        assert loop.time() < deadline, f"cell did not finish in {timeout}s: {''.join(out)}"
        if isinstance(raw, bytes):
            continue
        msg = json.loads(raw)
        if msg["parent_header"].get("msg_id") != "cell":
            continue
        kind = msg["msg_type"]
        if kind == "stream":
            out.append(msg["content"]["text"])
        elif kind == "error":
            raise AssertionError("\n".join(msg["content"]["traceback"]) + "".join(out))
        elif kind == "execute_reply":
            replied = True
        elif kind == "status" and msg["content"]["execution_state"] == "idle":
            idle = True
    ws.close()
    return "".join(out)


def run_cell(platform: Platform, user: str, token: str, code: str, timeout: float = 120) -> Any:
    """The JSON the cell printed on its last line."""
    text = IOLoop.current().run_sync(
        lambda: _execute(platform.url, user, token, textwrap.dedent(code), timeout))
    return json.loads(text.strip().splitlines()[-1])


PROBE = """
import json, os, signal
def probe(action):
    try:
        action()
        return "allowed"
    except PermissionError:
        return "refused"
    except OSError as exc:
        return f"{{type(exc).__name__}}: {{exc}}"
home, hub = {home!r}, {home!r} + "/hub"
found = {{
    "other home": probe(lambda: os.listdir({other_home!r})),
    "other file": probe(lambda: open({other_home!r} + "/secret.txt").read()),
    "cookie secret": probe(lambda: open(hub + "/jupyterhub_cookie_secret", "rb").read()),
    "accounts": probe(lambda: open(hub + "/accounts.json").read()),
    "hub database": probe(lambda: open(hub + "/jupyterhub.sqlite", "rb").read(1)),
    "tuner database": probe(lambda: open(home + "/tunehub.sqlite", "rb").read(1)),
    "tuner database (write)": probe(lambda: open(home + "/tunehub.sqlite", "ab").close()),
    "tuner secret": probe(lambda: open(home + "/tuner-cookie-secret", "rb").read()),
    "gpu locks": probe(lambda: os.listdir(home + "/gpu-locks")),
    "sweeps list": probe(lambda: os.listdir(home + "/sweeps")),
    "signal other": probe(lambda: os.kill({other_pid}, signal.SIGTERM)),
    "signal hub": probe(lambda: os.kill({hub_pid}, signal.SIGTERM)),
    "other's data file (write)": probe(lambda: open({data!r} + "/{other}.txt", "a").close()),
    "other's data file (delete)": probe(lambda: os.unlink({data!r} + "/{other}.txt")),
}}
found["other's data file (read)"] = open({data!r} + "/{other}.txt").read()
print(json.dumps({{"uid": os.getuid(), "found": found}}))
"""

TRAIN = """\
import os
import tensorflow as tf
import tuner

p = tuner.params()
print("running as uid", os.getuid())
try:
    open(os.environ["COOKIE"], "rb").read()
    print("cookie secret: READ")
except PermissionError:
    print("cookie secret: refused")
print("tuner token in my environment:", "JUPYTERHUB_API_TOKEN" in os.environ)
try:
    os.unlink("trial.log")  # to put a link to a secret in its place, for the logs API
    print("trial.log: REMOVED")
except PermissionError:
    print("trial.log: kept")
module = tf.Module()
module.x = tf.Variable(p["x"])
saved = tuner.save_model(module)
os.symlink(os.environ["COOKIE"], saved / "leak")  # for the registry to copy, it hopes
tuner.report(os.getuid() + p["x"])
"""


def test_people_are_separated_by_the_os_and_their_sweeps_still_work(
    platform: Platform,
) -> None:
    assert os.geteuid() == 0, "this test needs root (the suite runs as root on this machine)"
    platform.start()
    assert "share this Unix account" not in platform.output, platform.output
    admin = Hub(platform.url, login_token(platform.url, "admin", platform.password or ""))
    admin.call("POST", "hub/api/users", 201, json={"usernames": ["alice", "bob"]})
    users = UnixUsers.from_env(platform.home, platform.env)
    tokens, facts = {}, {}
    for name in ("alice", "bob"):
        tokens[name] = admin.call("POST", f"hub/api/users/{name}/tokens", 201,
                                  json={"note": "t"})["token"]
        admin.start_server(name, "cpu")
        facts[name] = run_cell(platform, name, tokens[name], f"""
            import json, os, pathlib
            pathlib.Path(os.path.expanduser("~/secret.txt")).write_text("{name}'s secret")
            pathlib.Path(os.environ["TUNEHUB_DATA"], "{name}.txt").write_text("{name} shares")
            print(json.dumps({{"uid": os.getuid(), "pid": os.getpid(),
                               "home": os.path.expanduser("~")}}))
        """)
        account = users.lookup(name)
        assert account is not None and facts[name]["uid"] == account.uid != 0
        assert facts[name]["home"] == str(platform.home / "users" / name)
    hub_pid = int((platform.home / "hub" / "jupyterhub.pid").read_text())

    for me, other in (("alice", "bob"), ("bob", "alice")):
        seen = run_cell(platform, me, tokens[me], PROBE.format(
            home=str(platform.home), other_home=facts[other]["home"], other=other,
            other_pid=facts[other]["pid"], hub_pid=hub_pid, data=str(platform.data)))
        found = seen.pop("found")
        assert found.pop("other's data file (read)") == f"{other} shares"
        assert found == dict.fromkeys(found, "refused"), (me, found)
        assert seen["uid"] == facts[me]["uid"]

    # Sweeps from the notebook: alice's from a code directory, bob's as a function.
    cookie = str(platform.home / "hub" / "jupyterhub_cookie_secret")
    alice_sweep = run_cell(platform, "alice", tokens["alice"], f"""
        import json, os, pathlib, tuner
        code = pathlib.Path(os.path.expanduser("~/data/alice-quad"))  # the data store
        code.mkdir(exist_ok=True)
        (code / "train.py").write_text({TRAIN!r})
        sweep = tuner.Sweep.submit(name="as-alice", code=str(code), command="python train.py",
                                   metric="uid", trials=2, parallelism=2,
                                   env={{"COOKIE": {cookie!r}}},
                                   space={{"x": {{"type": "float", "low": 0, "high": 0.5}}}},
                                   promote={{"model": "alice-model", "policy": "always"}})
        print(json.dumps(sweep.id))
    """)
    bob_sweep = run_cell(platform, "bob", tokens["bob"], """
        import json, tuner
        def objective(p):
            import os
            import jinja2  # preloaded: the tuner reads bob's pickle as bob's file
            return os.getuid() + p["x"] + 0 * len(jinja2.__name__)
        sweep = tuner.Sweep.submit(function=objective, name="as-bob", metric="uid", trials=2,
                                   space={"x": {"type": "float", "low": 0, "high": 0.5}})
        print(json.dumps(sweep.id))
    """)
    api = "services/tuner/api/v1"
    people = {n: Hub(platform.url, tokens[n]) for n in tokens}
    for name, sweep_id in (("alice", alice_sweep), ("bob", bob_sweep)):
        done = wait_for(lambda n=name, s=sweep_id: (
            (v := people[n].call("GET", f"{api}/sweeps/{s}", 200))["state"]
            in ("completed", "failed") and v), timeout=300, what=f"{name}'s sweep")
        assert done["state"] == "completed", done
        assert int(done["best_value"]) == facts[name]["uid"], done  # trials ran as the owner
        people["bob" if name == "alice" else "alice"].call("GET", f"{api}/sweeps/{sweep_id}", 404)
    log = people["alice"].client.get(f"{api}/sweeps/{alice_sweep}/trials/0/logs").text
    assert f"running as uid {facts['alice']['uid']}" in log, log
    assert "cookie secret: refused" in log and "in my environment: False" in log, log
    assert "trial.log: kept" in log, log
    bob_log = people["bob"].client.get(f"{api}/sweeps/{bob_sweep}/trials/0/logs").text
    assert "warm start" in bob_log and "jinja2" in bob_log.split("\n", 2)[1], bob_log
    versions = people["alice"].call("GET", f"{api}/models/alice-model", 200)
    assert [v["stage"] for v in versions] == ["production"], versions
    registered = Path(versions[0]["path"])
    assert (registered / "saved_model.pb").is_file()
    assert not (registered / "leak").exists() and not (registered / "leak").is_symlink()
    people["bob"].call("GET", f"{api}/models/alice-model", 404)

    # A snapshot is taken with the submitter's rights: not of the hub's state, nor bob's home.
    for code in (str(platform.home / "hub"), facts["bob"]["home"]):
        spec = {"name": "steal", "code": code, "command": "python x.py", "metric": "m",
                "trials": 1, "space": {"x": {"type": "float", "low": 0, "high": 1}}}
        r = people["alice"].client.post(f"{api}/sweeps", json={"spec": spec})
        assert r.status_code == 400 and "code" in r.text, r.text


def test_deleting_an_account_stops_its_servers_and_trials_and_keeps_its_files(
    platform: Platform,
) -> None:
    assert os.geteuid() == 0, "this test needs root (the suite runs as root on this machine)"
    platform.start()
    admin = Hub(platform.url, login_token(platform.url, "admin", platform.password or ""))
    admin.call("POST", "hub/api/users/carol", 201)
    token = admin.call("POST", "hub/api/users/carol/tokens", 201, json={"note": "t"})["token"]
    admin.start_server("carol", "cpu")
    sweep_id = run_cell(platform, "carol", token, """
        import json, os, pathlib, tuner
        pathlib.Path(os.path.expanduser("~/notes.txt")).write_text("keep me")
        def objective(p):
            import time
            time.sleep(3600)
        sweep = tuner.Sweep.submit(function=objective, name="long", metric="m", trials=1,
                                   space={"x": {"type": "float", "low": 0, "high": 1}})
        print(json.dumps(sweep.id))
    """)
    carol = UnixUsers.from_env(platform.home, platform.env).lookup("carol")
    assert carol is not None
    api = "services/tuner/api/v1"
    # The controller asks for the trial once its study is loaded (in a thread): the list may
    # still be empty on the first look.
    wait_for(lambda: [t["state"] for t in admin.call("GET", f"{api}/sweeps/{sweep_id}/trials", 200)
                      ][:1] == ["running"], timeout=120, what="carol's trial to run")
    wait_for(lambda: _processes_of(carol.uid) >= 2, timeout=60,
             what="carol's server and trial processes")

    admin.call("DELETE", "hub/api/users/carol", 204)
    wait_for(lambda: _processes_of(carol.uid) == 0, timeout=60,
             what="every process of carol's to stop")
    trial = wait_for(lambda: (t := admin.call("GET", f"{api}/sweeps/{sweep_id}/trials", 200)[0])
                     ["state"] not in ("running", "pending") and t, timeout=120,
                     what="carol's trial to end")
    assert trial["state"] == "failed", trial
    assert (carol.home / "notes.txt").read_text() == "keep me"  # left for an admin to archive
    assert pwd.getpwnam(carol.login).pw_shell == RETIRED_SHELL


def test_an_account_whose_login_is_taken_by_someone_else_runs_nothing(
    platform: Platform,
) -> None:
    """A system user at the account's login that tunehub did not make is never used: the
    server is refused with the reason (a 400), not started as that user or as root."""
    assert os.geteuid() == 0, "this test needs root (the suite runs as root on this machine)"
    taken = UnixUsers.from_env(platform.home, platform.env).login_name("mallory")
    subprocess.run(["useradd", "--system", "--no-create-home", taken], check=True)
    platform.start()
    admin = Hub(platform.url, login_token(platform.url, "admin", platform.password or ""))
    admin.call("POST", "hub/api/users/mallory", 201)
    r = admin.client.post("hub/api/users/mallory/server", json={"profile": "cpu"})
    assert r.status_code == 400, r.text
    assert f"the system user {taken!r} already exists and is not tunehub's" in r.text, r.text
    assert _processes_of(pwd.getpwnam(taken).pw_uid) == 0


def _processes_of(uid: int) -> int:
    count = 0
    for entry in Path("/proc").iterdir():
        try:
            status = (entry / "status").read_text() if entry.name.isdigit() else ""
        except OSError:
            continue
        if any(line.startswith("Uid:") and line.split()[1] == str(uid)
               for line in status.splitlines()):
            count += 1
    return count


def test_up_says_once_when_everyone_shares_one_account() -> None:
    """Not root: no system users, and the reason to use root or Kubernetes, in one line."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # a child that is not root, asking as tunehub up does
        try:
            os.setgid(65534)
            os.setuid(65534)
            env: dict[str, str] = {}
            on, note = decide(env)
            try:
                decide({"TUNEHUB_UNIX_USERS": "1"})
                refused = ""
            except CliError as exc:
                refused = str(exc)
            os.write(write_end, json.dumps([on, note, env, refused]).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        on, note, env, refused = json.loads(pipe.read())
    os.waitpid(pid, 0)
    assert on is False and env == {"TUNEHUB_UNIX_USERS": "0"}
    assert note == SHARED_NOTE.format(user=pwd.getpwuid(65534).pw_name)
    assert "\n" not in note and "root" in note and "Kubernetes" in note
    assert "needs tunehub up to run as root" in refused
