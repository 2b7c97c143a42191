"""One simulated hub user, the way hubtraf drives a JupyterHub: log in through the login form,
start a server, start a kernel, run code over the kernel's websocket, stop everything. Each
step is timed; any failure is recorded with the step it happened in."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

READY_TIMEOUT = 300.0
POLL_SECONDS = 0.5  # how often the user's browser would refresh the spawn-pending page
CODE = "import sys; print(sum(range(10)), sys.version_info[0])"
EXPECTED = "45 3"


@dataclass
class UserRun:
    name: str
    steps: dict[str, float] = field(default_factory=dict)
    failed: str | None = None  # "step: reason"


class StepFailed(Exception):
    pass


async def _login(client: httpx.AsyncClient, name: str, password: str) -> str:
    await client.get("/hub/login")
    xsrf = client.cookies.get("_xsrf") or ""
    r = await client.post("/hub/login", data={"username": name, "password": password,
                                              "_xsrf": xsrf})
    if r.status_code != 302:
        raise StepFailed(f"login answered {r.status_code}")
    xsrf = client.cookies.get("_xsrf") or xsrf
    r = await client.post(f"/hub/api/users/{name}/tokens", json={"note": "bench"},
                          headers={"X-XSRFToken": xsrf})
    if r.status_code not in (200, 201):
        raise StepFailed(f"token request answered {r.status_code}: {r.text[:200]}")
    return str(r.json()["token"])


async def _spawn(client: httpx.AsyncClient, name: str, auth: dict[str, str]) -> None:
    r = await client.post(f"/hub/api/users/{name}/server", json={}, headers=auth)
    if r.status_code not in (201, 202):
        raise StepFailed(f"spawn answered {r.status_code}: {r.text[:200]}")
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        r = await client.get(f"/hub/api/users/{name}", headers=auth)
        server = (r.json().get("servers") or {}).get("")
        if server and server.get("ready"):
            return
        if not server or not server.get("pending") and not server.get("ready"):
            raise StepFailed("the server stopped while starting")
        await asyncio.sleep(POLL_SECONDS)
    raise StepFailed(f"not ready within {READY_TIMEOUT:.0f} s")


async def _run_code(base_ws: str, name: str, kernel: str, token: str) -> None:
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    session = uuid.uuid4().hex
    msg_id = uuid.uuid4().hex
    req = HTTPRequest(f"{base_ws}/user/{name}/api/kernels/{kernel}/channels?session_id={session}",
                      headers={"Authorization": f"token {token}"})
    ws = await websocket_connect(req)
    try:
        ws.write_message(json.dumps({
            "header": {"msg_id": msg_id, "username": name, "session": session,
                       "msg_type": "execute_request", "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": CODE, "silent": False, "store_history": False,
                        "user_expressions": {}, "allow_stdin": False},
        }))
        output, replied = "", False
        while not (replied and EXPECTED in output):
            raw = await asyncio.wait_for(ws.read_message(), timeout=120)
            if raw is None:
                raise StepFailed("kernel websocket closed")
            msg = json.loads(raw)
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = msg.get("msg_type") or msg.get("header", {}).get("msg_type")
            if kind == "stream":
                output += msg["content"].get("text", "")
            elif kind == "error":
                raise StepFailed(f"code raised {msg['content'].get('ename')}")
            elif kind == "execute_reply":
                replied = True
                if msg["content"].get("status") != "ok":
                    raise StepFailed(f"execute_reply {msg['content'].get('status')}")
    finally:
        ws.close()


async def simulate(base: str, name: str, password: str, delay: float) -> UserRun:
    run = UserRun(name)
    await asyncio.sleep(delay)  # ramp-up, as hubtraf spreads users over a period
    step = "login"
    async with httpx.AsyncClient(base_url=base, timeout=120) as client:
        try:
            t = time.perf_counter()
            token = await _login(client, name, password)
            run.steps["login"] = time.perf_counter() - t
            auth = {"Authorization": f"token {token}"}
            step = "spawn"
            t = time.perf_counter()
            await _spawn(client, name, auth)
            run.steps["spawn"] = time.perf_counter() - t
            step = "kernel"
            t = time.perf_counter()
            r = await client.post(f"/user/{name}/api/kernels", json={}, headers=auth)
            if r.status_code != 201:
                raise StepFailed(f"kernel start answered {r.status_code}: {r.text[:200]}")
            kernel = r.json()["id"]
            run.steps["kernel"] = time.perf_counter() - t
            step = "code"
            t = time.perf_counter()
            await _run_code(base.replace("http", "ws", 1), name, kernel, token)
            run.steps["code"] = time.perf_counter() - t
            step = "stop"
            t = time.perf_counter()
            await client.delete(f"/user/{name}/api/kernels/{kernel}", headers=auth)
            r = await client.delete(f"/hub/api/users/{name}/server", headers=auth)
            if r.status_code not in (202, 204):
                raise StepFailed(f"stop answered {r.status_code}")
            run.steps["stop"] = time.perf_counter() - t
        except Exception as exc:  # a user's failure is a result, not a crash
            run.failed = f"{step}: {type(exc).__name__}: {exc}"[:300]
    return run


def as_json(runs: list[UserRun]) -> list[dict[str, Any]]:
    return [{"name": r.name, "steps": r.steps, "failed": r.failed} for r in runs]
