"""The stand-in notebook servers of ``benchmarks/hub_scale.py``: one asyncio process that opens
one real listening port per person on request, so the hub's and the proxy's real traffic
reaches real sockets without a JupyterLab process per person (1,000 of those would not fit on
the benchmark machine, and their cost is not the one under test).

Run as ``python -m benchmarks._hub_standin SOCKET``; the hub's spawner
(:class:`benchmarks._hub_standin_spawner.StandInSpawner`) asks it over that Unix socket, one
JSON line per request: ``{"op": "start", "name", "env"}`` → ``{"port"}``, ``{"op": "poll",
"name"}`` → ``{"running"}``, ``{"op": "stop", "name"}`` → ``{}``, ``{"op": "stats"}``.

Each person's server does what a ``jupyterhub-singleuser`` server does towards the platform,
and nothing of what JupyterLab does for the person:

- it listens on a port of its own with the TLS certificate the hub made for that person
  (internal TLS: the proxy pins the person's certificate name), and requires the client
  certificate the hub and the proxy present, as the single-user server does;
- ``GET <prefix>api`` answers without authentication, with ``X-JupyterHub-Version`` (the hub's
  readiness check after a spawn);
- every other route under its prefix needs the person's token, which it checks as JupyterHub's
  ``HubAuth`` does: ``GET <hub api>/user`` with that token, the answer cached for 300 s;
  ``<prefix>api/status`` then answers as jupyter_server's does (other routes: 404);
- it reports its activity to the hub (``POST JUPYTERHUB_ACTIVITY_URL`` with the server's own
  token) at start and then every ``JUPYTERHUB_ACTIVITY_INTERVAL`` seconds while it was used,
  as the single-user server's activity loop does.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import random
import resource
import socket
import ssl
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web

#: How long a token's identity is kept (HubAuth's cache_max_age default).
TOKEN_CACHE_SECONDS = 300.0
#: The single-user server's default activity interval when the spawner sets none.
DEFAULT_ACTIVITY_INTERVAL = 300.0
HUB_TIMEOUT = ClientTimeout(total=60)


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


@dataclass
class Person:
    name: str
    prefix: str
    token: str  # the server's own API token (activity reports)
    api_url: str
    activity_url: str
    activity_interval: float
    site: web.SockSite
    port: int
    client: ClientSession
    started: float = field(default_factory=time.time)
    used: float = 0.0  # time.time() of the last authenticated request
    sent: float = 0.0  # the activity last reported
    identities: dict[str, tuple[float, dict[str, Any] | None]] = field(default_factory=dict)
    activity: asyncio.Task[None] | None = None


class StandIn:
    def __init__(self) -> None:
        self.people: dict[str, Person] = {}
        self.by_port: dict[int, Person] = {}
        self.runner: web.AppRunner | None = None
        self.counts: dict[str, int] = {"started": 0, "stopped": 0, "requests": 0,
                                       "token_checks": 0, "activity_posts": 0,
                                       "hub_errors": 0, "peak": 0}
        from jupyterhub import __version__

        self.hub_version = __version__

    async def setup(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self.runner.setup()

    # --- a person's server -------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.counts["requests"] += 1
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        person = self.by_port.get(sockname[1]) if sockname else None
        if person is None or not request.path.startswith(person.prefix):
            return web.json_response({"message": "not found"}, status=404)
        rest = request.path[len(person.prefix):]
        if rest == "api" and request.method == "GET":
            return web.json_response({"version": "2.14.0"},
                                     headers={"X-JupyterHub-Version": self.hub_version})
        header = request.headers.get("Authorization", "")
        kind, _, token = header.partition(" ")
        if kind.lower() not in ("token", "bearer") or not token:
            return web.json_response({"message": "Forbidden"}, status=403)
        model = await self.identify(person, token.strip())
        if model is None or model.get("name") != person.name:
            return web.json_response({"message": "Forbidden"}, status=403)
        person.used = time.time()
        if rest == "api/status" and request.method == "GET":
            started = datetime.fromtimestamp(person.started, timezone.utc).isoformat()
            return web.json_response({"started": started, "last_activity": _now_iso(),
                                      "connections": 0, "kernels": 0})
        return web.json_response({"message": "not found"}, status=404)

    async def identify(self, person: Person, token: str) -> dict[str, Any] | None:
        """Who ``token`` is, asked of the hub as HubAuth does, cached TOKEN_CACHE_SECONDS."""
        key = hashlib.sha256(token.encode()).hexdigest()
        cached = person.identities.get(key)
        if cached is not None and time.monotonic() - cached[0] < TOKEN_CACHE_SECONDS:
            return cached[1]
        self.counts["token_checks"] += 1
        try:
            async with person.client.get(f"{person.api_url.rstrip('/')}/user",
                                         headers={"Authorization": f"token {token}"}) as r:
                model = await r.json() if r.status == 200 else None
        except (ClientError, TimeoutError, ValueError):
            self.counts["hub_errors"] += 1
            return None  # not cached: the next request asks again
        person.identities[key] = (time.monotonic(), model)
        return model

    async def report_activity(self, person: Person) -> None:
        """At start, then every interval (jittered) if the server was used since."""
        first = True
        while True:
            if first or person.used > person.sent:
                stamp = person.used or person.started
                iso = datetime.fromtimestamp(stamp, timezone.utc).isoformat()
                body = {"servers": {"": {"last_activity": iso}}, "last_activity": iso}
                try:
                    async with person.client.post(
                            person.activity_url, json=body,
                            headers={"Authorization": f"token {person.token}"}) as r:
                        await r.read()
                        if r.status < 400:
                            person.sent = stamp
                        else:
                            self.counts["hub_errors"] += 1
                except (ClientError, TimeoutError):
                    self.counts["hub_errors"] += 1
                self.counts["activity_posts"] += 1
            first = False
            await asyncio.sleep(person.activity_interval * random.uniform(0.9, 1.1))

    # --- control -----------------------------------------------------------------------------

    async def start(self, name: str, env: dict[str, str]) -> dict[str, Any]:
        if name in self.people:
            await self.stop(name)
        assert self.runner is not None
        key, cert, ca = (env.get("JUPYTERHUB_SSL_KEYFILE"), env.get("JUPYTERHUB_SSL_CERTFILE"),
                         env.get("JUPYTERHUB_SSL_CLIENT_CA"))
        server_tls: ssl.SSLContext | None = None
        client_tls: ssl.SSLContext | bool = True
        if key and cert:
            from jupyterhub.utils import make_ssl_context

            # As jupyterhub-singleuser: its certificate, client certificates required
            # (signed by the CAs in the bundle), and the same pair to call the hub with.
            server_tls = make_ssl_context(key, cert, cafile=ca,
                                          purpose=ssl.Purpose.CLIENT_AUTH)
            client_tls = make_ssl_context(key, cert, cafile=ca)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
        site = web.SockSite(self.runner, sock, ssl_context=server_tls, backlog=128)
        await site.start()
        client = ClientSession(connector=TCPConnector(ssl=client_tls, limit=4),
                               timeout=HUB_TIMEOUT)
        interval = float(env.get("JUPYTERHUB_ACTIVITY_INTERVAL") or DEFAULT_ACTIVITY_INTERVAL)
        person = Person(name=name, prefix=env.get("JUPYTERHUB_SERVICE_PREFIX", f"/user/{name}/"),
                        token=env.get("JUPYTERHUB_API_TOKEN", ""),
                        api_url=env.get("JUPYTERHUB_API_URL", ""),
                        activity_url=env.get("JUPYTERHUB_ACTIVITY_URL", ""),
                        activity_interval=interval, site=site, port=port, client=client)
        self.people[name] = person
        self.by_port[port] = person
        if person.activity_url:
            person.activity = asyncio.get_running_loop().create_task(
                self.report_activity(person))
        self.counts["started"] += 1
        self.counts["peak"] = max(self.counts["peak"], len(self.people))
        return {"port": port}

    async def stop(self, name: str) -> dict[str, Any]:
        person = self.people.pop(name, None)
        if person is None:
            return {}
        self.by_port.pop(person.port, None)
        if person.activity is not None:
            person.activity.cancel()
        with contextlib.suppress(Exception):
            await person.site.stop()
        await person.client.close()
        self.counts["stopped"] += 1
        return {}

    async def control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
            msg = json.loads(line or b"{}")
            op = msg.get("op")
            if op == "start":
                answer = await self.start(str(msg["name"]), dict(msg.get("env") or {}))
            elif op == "poll":
                answer = {"running": msg.get("name") in self.people}
            elif op == "stop":
                answer = await self.stop(str(msg["name"]))
            elif op == "stats":
                answer = {**self.counts, "running": len(self.people)}
            else:
                answer = {"error": f"unknown op {op!r}"}
        except Exception as exc:  # the hub gets the reason, the stand-in goes on
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        writer.write(json.dumps(answer).encode() + b"\n")
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()


async def main(path: str) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    standin = StandIn()
    await standin.setup()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    server = await asyncio.start_unix_server(standin.control, path, backlog=1024)
    os.chmod(path, 0o600)
    print(f"stand-in servers: control socket {path}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
