"""The platform over time, through ``tunehub up`` and real HTTP: a restart keeps users, sweeps
and the admin's login; idle GPU servers are culled sooner than CPU-only ones, a server whose
kernel is busy running a cell is not idle, and a GPU given back can be taken by someone else; a
server that cannot start says why (never a bare 500)."""

from __future__ import annotations

import grp
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from tornado.httpclient import HTTPRequest
from tornado.ioloop import IOLoop
from tornado.websocket import websocket_connect

from tests.hub_fixtures import Platform
from tests.polling import wait_for
from tunehub_base.gpu_holders import HolderBook
from tunehub_base.unix_users import closed_ancestors, grant_passage, revoke_passage

pytestmark = [pytest.mark.slow]

TRIAL = """\
import tuner
p = tuner.params()
tuner.report(1 - (p["x"] - 0.3) ** 2)
"""


def login_token(url: str, username: str, password: str) -> str:
    """Log in through the hub's login form, as a browser does, and create an API token."""
    with httpx.Client(base_url=url, timeout=30) as client:
        page = client.get("hub/login")
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page.text)
        assert xsrf, page.text[:2000]
        r = client.post("hub/login", data={"username": username, "password": password,
                                           "_xsrf": xsrf.group(1)})
        assert r.status_code in (200, 302) and "jupyterhub-session-id" in client.cookies, (
            f"login as {username} failed: {r.status_code}"
        )
        r = client.post(f"hub/api/users/{username}/tokens", json={"note": "test"},
                        headers={"X-XSRFToken": client.cookies["_xsrf"]})
        assert r.status_code == 201, r.text
        return r.json()["token"]


class Hub:
    """The hub's and the tuner's REST APIs with one token."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.client = httpx.Client(base_url=url, timeout=60,
                                   headers={"Authorization": f"token {token}"})

    def call(self, method: str, path: str, expect: int | tuple[int, ...], **kw: Any) -> Any:
        r = self.client.request(method, path, **kw)
        expected = expect if isinstance(expect, tuple) else (expect,)
        assert r.status_code in expected, f"{method} {path}: {r.status_code} {r.text}"
        return r.json() if r.content else None

    def server(self, user: str) -> dict[str, Any] | None:
        return self.call("GET", f"hub/api/users/{user}", 200)["servers"].get("")

    def start_server(self, user: str, profile: str) -> None:
        self.call("POST", f"hub/api/users/{user}/server", (201, 202), json={"profile": profile})
        wait_for(lambda: (self.server(user) or {}).get("ready"), timeout=120,
                 what=f"{user}'s {profile} server")


def test_restart_keeps_users_sweeps_and_the_admin_login(platform: Platform) -> None:
    platform.start()
    assert platform.password, platform.output
    password = platform.password
    hub = Hub(platform.url, login_token(platform.url, "admin", password))
    hub.call("POST", "hub/api/users/carol", 201)

    code = platform.data / "quadratic"
    code.mkdir(parents=True)
    (code / "train.py").write_text(TRIAL)
    spec = {"name": "kept", "code": str(code), "command": "python train.py", "metric": "score",
            "trials": 3, "parallelism": 1, "space": {"x": {"type": "float", "low": 0, "high": 1}}}
    sweep = hub.call("POST", "services/tuner/api/v1/sweeps", 201, json={"spec": spec})
    done = wait_for(
        lambda: (s := hub.call("GET", f"services/tuner/api/v1/sweeps/{sweep['id']}", 200))
        ["state"] == "completed" and s,
        timeout=180, what="the sweep to complete",
    )
    assert platform.stop() == 0

    # Second start: the same state, no new password, the old one still logs in.
    platform.password = None
    platform.start()
    assert platform.password is None and "admin /" not in platform.output, platform.output
    hub = Hub(platform.url, login_token(platform.url, "admin", password))
    users = {u["name"] for u in hub.call("GET", "hub/api/users", 200)}
    assert {"admin", "carol"} <= users
    again = hub.call("GET", f"services/tuner/api/v1/sweeps/{sweep['id']}", 200)
    assert again["state"] == "completed"
    assert again["best_value"] == done["best_value"]
    trials = hub.call("GET", f"services/tuner/api/v1/sweeps/{sweep['id']}/trials", 200)
    assert len(trials) == 3 and all(t["state"] == "completed" for t in trials)


async def _run_busy_cell(url: str, user: str, token: str) -> None:
    """Start a kernel on ``user``'s server and leave it busy running a long cell."""
    base = f"{url}user/{user}/api/kernels"
    with httpx.Client(timeout=60, headers={"Authorization": f"token {token}"}) as client:
        r = client.post(base, json={"name": "python3"})
        assert r.status_code == 201, r.text
        kernel = r.json()["id"]
    ws_url = base.replace("http", "ws", 1) + f"/{kernel}/channels"
    ws = await websocket_connect(HTTPRequest(ws_url, headers={"Authorization": f"token {token}"}))
    msg_id = "busy-cell"
    ws.write_message(json.dumps({
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": user,
                   "session": "test", "version": "5.3", "date": ""},
        "parent_header": {}, "metadata": {}, "buffers": [], "channel": "shell",
        "content": {"code": "import time\ntime.sleep(3600)", "silent": False,
                    "store_history": False, "user_expressions": {}, "allow_stdin": False},
    }))
    while True:  # until the kernel says it is busy with our cell
        raw = await ws.read_message()
        assert raw is not None, "the kernel's websocket closed"
        if isinstance(raw, bytes):
            continue
        msg = json.loads(raw)
        if (msg.get("msg_type") == "status" and msg["content"]["execution_state"] == "busy"
                and msg["parent_header"].get("msg_id") == msg_id):
            break
    ws.close()  # the cell keeps running without anyone watching, as after closing a tab


def test_idle_gpu_servers_are_culled_first_and_busy_kernels_are_not_idle(
    platform: Platform,
) -> None:
    gpu_timeout = 20
    platform.env.update({
        "TUNEHUB_LOCAL_GPUS": "0,1",  # two (pretend) GPUs: profiles cpu, gpu-1, gpu-2
        "TUNEHUB_GPU_IDLE_TIMEOUT": str(gpu_timeout),
        "TUNEHUB_CPU_IDLE_TIMEOUT": "3600",
        "TUNEHUB_CULL_EVERY": "2",
        "TUNEHUB_ACTIVITY_INTERVAL": "2",
    })
    platform.start()
    assert platform.password, platform.output
    hub = Hub(platform.url, login_token(platform.url, "admin", platform.password))
    hub.call("POST", "hub/api/users", 201,
             json={"usernames": ["cpu-idle", "gpu-busy", "gpu-idle", "gpu-late"]})

    hub.start_server("cpu-idle", "cpu")
    hub.start_server("gpu-busy", "gpu-1")
    token = hub.call("POST", "hub/api/users/gpu-busy/tokens", 201, json={"note": "t"})["token"]
    IOLoop.current().run_sync(lambda: _run_busy_cell(platform.url, "gpu-busy", token))
    # Started after the busy cell's last message: if busy kernels did not count as activity,
    # gpu-busy would look idle for longer than gpu-idle and go in the same culler pass.
    hub.start_server("gpu-idle", "gpu-1")
    started = time.monotonic()
    # Everyone sees who holds them: each notebook server named as its GPU's holder.
    book = HolderBook(platform.home / "gpu-locks")
    holders = {r["holder"]["person"]: r for r in book.pool(["0", "1"]) if r["holder"]}
    assert sorted(holders) == ["gpu-busy", "gpu-idle"], book.pool(["0", "1"])
    assert {r["holder"]["kind"] for r in holders.values()} == {"notebook"}

    # Both GPUs are held, by notebooks (nothing to preempt): a third GPU server waits in the
    # pool's queue, not refused, and gets the first GPU freed.
    r = hub.client.post("hub/api/users/gpu-late/server", json={"profile": "gpu-1"})
    assert r.status_code == 202 and (hub.server("gpu-late") or {}).get("pending") == "spawn", \
        r.text
    # The spawner reached the tuner's queue (internal TLS, the shared secret): it waits there.
    queue = wait_for(lambda: hub.call("GET", "services/tuner/api/v1/pool", 200)["queue"],
                     timeout=60, what="the waiting server in the tuner's queue")
    assert [(q["position"], q["person"], q["kind"]) for q in queue] == [
        (1, "gpu-late", "notebook")]

    wait_for(lambda: hub.server("gpu-idle") is None, timeout=gpu_timeout + 90,
             what="the idle GPU server to be culled")
    assert time.monotonic() - started >= gpu_timeout - 5  # not before its idle timeout
    assert (hub.server("gpu-busy") or {}).get("ready"), "a busy kernel's server was culled"
    assert (hub.server("cpu-idle") or {}).get("ready"), "a CPU server went at the GPU timeout"

    # The culled server's GPU is back in the pool, its time in the ledger, and the waiting
    # server took it.
    assert [i["person"] for i in book.intervals()] == ["gpu-idle"]
    wait_for(lambda: (hub.server("gpu-late") or {}).get("ready"), timeout=120,
             what="the waiting GPU server to start on the freed GPU")
    held = {r["holder"]["person"] for r in book.pool(["0", "1"]) if r["holder"]}
    assert held == {"gpu-busy", "gpu-late"}


def test_a_server_whose_user_cannot_run_python_says_why(platform: Platform) -> None:
    """What the culler test met on a loaded machine: another test suite's clean-up took this
    platform's passage through ``/root`` (where this Python lives) away, so a person's server
    could not exec Python, and the hub answered a bare "500 Internal Server Error". The person
    gets the reason and the directory to open instead; once it is open the same account starts."""
    closed = closed_ancestors([Path(sys.executable), Path(sys.base_prefix)])
    if "TUNEHUB_UNIX_GROUP" not in platform.env or not closed:
        pytest.skip("needs root (system users) and a Python under a directory closed to others")
    platform.start()
    assert platform.password, platform.output
    hub = Hub(platform.url, login_token(platform.url, "admin", platform.password))
    hub.call("POST", "hub/api/users/dana", 201)
    gid = grp.getgrnam(platform.env["TUNEHUB_UNIX_GROUP"]).gr_gid
    revoke_passage(gid, closed)
    try:
        r = hub.client.post("hub/api/users/dana/server", json={"profile": "cpu"})
    finally:
        grant_passage(gid, closed)
    assert r.status_code == 503, r.text
    message = r.json()["message"]
    assert "your server could not be started as " in message, message
    assert f"{closed[0]} is closed to others" in message, message
    hub.start_server("dana", "cpu")
