"""A thousand people on the hub (issue 30): simulated people log in, start servers, list their
sweeps and submit small sweeps over an hour of use compressed into minutes, against the real
platform: ``tunehub up`` (JupyterHub with the repository's production config, tunehub's proxy,
the tuner service, the idle culler, internal TLS) with only the spawner swapped for a stand-in.

What is real: the hub and its SQLite database (``hub_scale_hub_postgres=1``: PostgreSQL), the
login form with tunehub's authenticator (scrypt-hashed accounts, the login throttle), the
hub's API and its token checks, the proxy (``python -m hub.proxy``, configurable-http-proxy
from PyPI with tunehub's fixes) and its routes, the per-person internal TLS certificates the hub
makes at each spawn, the tuner service on a PostgreSQL cluster of the benchmark's own
(``initdb``/``pg_ctl`` in scratch), its token checks against the hub, and the sweeps it runs
(local backend: one trial per sweep, a fresh ``python -c`` that imports tuner and reports one
value). What stands in: each person's notebook server is one listening port of ONE asyncio
process (``_hub_standin.py``, asked by ``_hub_standin_spawner.StandInSpawner``), which answers
what a single-user server answers the hub and the proxy (readiness, token-checked
``api/status``, activity reports), not JupyterLab's work.

The people are asyncio clients of this process (aiohttp, one session and one loopback source
address each, ``127.1.x.y``, so the proxy's per-address caps and the login throttle see one
address per person, as in a deployment), arriving uniformly over the first 75 % of the
compressed hour. Each: loads the login page and posts the form (password), asks the hub's API
for a token (cookie + XSRF, as the hub's pages do), starts its server and polls its user model
every 0.5 s until ready (spawn time), checks its server through the proxy, lists its sweeps in
the tuner; ``hub_scale_submit_percent`` of them submit a one-trial sweep and poll it every 1 s
(as ``Sweep.watch()``) until it ends; every 5 simulated minutes each refreshes the sweeps list
and its server's status; in the last 10 % of the hour each stops its server (polling until it
is gone). Every request is timed; anything but the expected status, a connection error or a
timeout (120 s) is a failure.

Sizes (``--set``): ``hub_scale_people`` (1000; quick 20), ``hub_scale_window_s`` (the compressed
hour: 600; quick 45), ``hub_scale_submit_percent`` (30), ``hub_scale_postgres`` (1: the tuner on
PostgreSQL; 0: SQLite), ``hub_scale_hub_postgres`` (0: the hub's own database on SQLite; 1: on
the same PostgreSQL cluster), ``hub_scale_seed`` (1).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import resource
import socket
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks._base import Benchmark, NotMeasured, RunContext
from benchmarks._common import REPO, free_port, ms, secs, summary
from benchmarks.hub import tunehub_up
from benchmarks.reports import LocalPostgres, pg_bin

START_TIMEOUT = 300.0
REQUEST_TIMEOUT = 120.0
READY_TIMEOUT = 300.0  # a spawn not ready by then is a failure
SWEEP_TIMEOUT = 600.0
SPAWN_POLL = 0.5  # the spawn page's refresh, as benchmarks/_hubtraf.py
SWEEP_POLL = 1.0  # Sweep.watch()'s default interval
REFRESH_SIMULATED_S = 300.0  # a person looks at their sweeps and server every 5 minutes
ARRIVE_UNTIL = 0.75  # arrivals spread uniformly over the first 75 % of the hour
LEAVE_FROM = 0.90  # people stop their servers in the last 10 %
SIMULATED_HOUR = 3600.0
TARGET_API_P95 = 1.0
#: JupyterHub's own figure the issue quotes for 1,000 servers.
REFERENCE = ("JupyterHub's own 1,000-server load test: 2.6 % failures with the faster proxy "
             "(the figure issue 30 quotes)")
#: Limits set in the hub config as a deployment for this many people would set them.
CONCURRENT_SPAWN_LIMIT = 100
#: The sweep a submitting person sends: one trial, the cheapest command that is a real trial
#: (a fresh Python that imports the SDK and reports the metric once).
SWEEP_COMMAND = "python -c 'import tuner; tuner.report(0.5)'"

REQUEST_STEPS = {
    # step: (what it is, expected statuses)
    "login_page": ("GET /hub/login", (200,)),
    "login_post": ("POST /hub/login (the form, password)", (302,)),
    "token": ("POST /hub/api/users/NAME/tokens (cookie + XSRF)", (200, 201)),
    "spawn_request": ("POST /hub/api/users/NAME/server", (201, 202)),
    "spawn_poll": ("GET /hub/api/users/NAME while starting/stopping", (200,)),
    "server_status": ("GET /user/NAME/api/status (proxy → stand-in, token checked by the hub)",
                      (200,)),
    "sweeps_list": ("GET /services/tuner/api/v1/sweeps", (200,)),
    "sweep_submit": ("POST /services/tuner/api/v1/sweeps (1 trial)", (201,)),
    "sweep_get": ("GET /services/tuner/api/v1/sweeps/ID until it ends", (200,)),
    "stop_request": ("DELETE /hub/api/users/NAME/server", (202, 204)),
}
#: Requests the hub answers only when the spawn or stop is done (or after 10 s).
WAITS = ("spawn_request", "stop_request")
PHASES = {
    "login": "login page + form post",
    "spawn": "spawn request until the hub says ready",
    "sweep": "sweep submitted until the tuner says it ended",
    "stop": "stop request until the server is gone",
}


def postmaster_pid(pg: LocalPostgres | None) -> int | None:
    if pg is None:
        return None
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int((pg.data / "postmaster.pid").read_text().split()[0])
    return None


# --- accounts, the stand-in, the hub config, tunehub up ---------------------------------------


def create_accounts(accounts_file: Path, names: list[str]) -> dict[str, str]:
    """One account per person, each with its own password and scrypt hash, written in one go
    (the hashing in threads: scrypt releases the GIL)."""
    from tunehub_base.accounts import AccountStore, check_username, hash_password, random_password

    passwords = {name: random_password() for name in names}
    for name in names:
        check_username(name)
    with ThreadPoolExecutor(max_workers=max(1, len(os.sched_getaffinity(0)))) as pool:
        hashes = dict(zip(names, pool.map(hash_password, passwords.values()), strict=True))
    accounts_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    store = AccountStore(accounts_file)
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    with store._editing() as users:  # the store's own writer (lock, 0600, atomic replace)
        for name in names:
            users[name] = {"admin": False, "password": hashes[name], "created_at": created}
    return passwords


@contextlib.contextmanager
def standin(scratch: Path, log: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    sock = scratch / "standin.sock"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "benchmarks._hub_standin", str(sock)],
                                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise NotMeasured("the stand-in servers' process did not start: "
                                  + log.read_text(errors="replace")[-500:])
            time.sleep(0.1)  # waiting for its control socket
        yield str(sock), proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def standin_stats(sock: str) -> dict[str, Any]:
    with contextlib.suppress(OSError, ValueError), socket.socket(socket.AF_UNIX) as s:
        s.settimeout(30)
        s.connect(sock)
        s.sendall(b'{"op": "stats"}\n')
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        answer: dict[str, Any] = json.loads(data)
        return answer
    return {}


def limits(people: int) -> dict[str, Any]:
    """The limits the benchmark's hub runs with, as a deployment for ``people`` would set them
    (each documented in the section)."""
    return {
        "JupyterHub.concurrent_spawn_limit": CONCURRENT_SPAWN_LIMIT,
        "JupyterHub.active_server_limit": people,
        "Spawner.start_timeout / http_timeout": "120 s / 120 s (tunehub's config)",
        "Spawner.poll_interval": "30 s (JupyterHub's default)",
        "TunehubAuthenticator.max_failed_logins / lockout_seconds": "5 / 60 s per (account, "
        "client address); only failed logins count",
        "TUNEHUB_PROXY_MAX_CLIENT_CONNECTIONS": "256 per client address (default)",
        "TUNEHUB_PROXY_MAX_CONNECTIONS": "0: half the proxy's descriptors (default)",
        "TUNEHUB_MAX_WORKERS_PER_PERSON": "32 (default)",
        "TUNEHUB_CPU_IDLE_TIMEOUT": "7200 s (default; the culler runs)",
        "TUNEHUB_ACTIVITY_INTERVAL": "120 s (default; the stand-in reports at this rate)",
    }


HUB_CONFIG = """\
# Written by benchmarks/hub_scale.py: the repository's production config, then the stand-in
# spawner and the limits a deployment for {people} people sets.
c = get_config()  # noqa: F821
load_subconfig({production!r})  # noqa: F821
c.JupyterHub.spawner_class = "benchmarks._hub_standin_spawner.StandInSpawner"
c.StandInSpawner.standin_socket = {socket!r}
# At most this many spawns in progress at once (JupyterHub's default, which a deployment of a
# thousand people keeps: above it a spawn is refused with 429 and counted as a failure here).
c.JupyterHub.concurrent_spawn_limit = {spawn_limit}
# Everyone may have a server at once: the limit is the number of people.
c.JupyterHub.active_server_limit = {people}
"""


def hub_env(home: Path, port: int, tuner_db: str, hub_db: str | None) -> dict[str, str]:
    from benchmarks.hub import hub_env as plain_env

    env = plain_env(home, port)  # TUNEHUB_UNIX_USERS=0: no system user per simulated person
    env["TUNEHUB_DB_URL"] = tuner_db
    if hub_db:
        env["TUNEHUB_HUB_DB_URL"] = hub_db
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


# --- what each part of the platform used: CPU and memory from /proc ---------------------------


def _proc_table() -> dict[int, tuple[int, str, float, float, int]]:
    """pid -> (ppid, cmdline, own CPU s, reaped children's CPU s, RSS bytes)."""
    tick = os.sysconf("SC_CLK_TCK")
    page = os.sysconf("SC_PAGE_SIZE")
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace")
            out[int(entry)] = (int(fields[1]), cmd, (int(fields[11]) + int(fields[12])) / tick,
                               (int(fields[13]) + int(fields[14])) / tick,
                               int(fields[21]) * page)
    return out


class Sampler:
    """Every 2 s: CPU seconds and RSS of the hub, the proxy, the tuner, its trials, the culler,
    PostgreSQL, the stand-in and this load generator."""

    INTERVAL = 2.0

    def __init__(self, roots: dict[str, int | None]) -> None:
        self.roots = {k: v for k, v in roots.items() if v}
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.peak_rss: dict[str, int] = defaultdict(int)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _find(self, table: dict[int, tuple[int, str, float, float, int]]) -> None:
        hub = self.roots.get("hub")
        if hub and "tuner" not in self.roots:
            for pid, (ppid, cmd, *_rest) in table.items():
                # The service itself: the hub's child, or its keeper's (tuner.keeper).
                keeper = table.get(ppid)
                if "tuner.service" in cmd and (ppid == hub or (
                        keeper is not None and keeper[0] == hub and "tuner.keeper" in keeper[1])):
                    self.roots["tuner"] = pid
                elif ppid == hub and "culler" in cmd:
                    self.roots["culler"] = pid

    def sample(self) -> None:
        table = _proc_table()
        self._find(table)
        children: dict[int, list[int]] = defaultdict(list)
        for pid, row in table.items():
            children[row[0]].append(pid)

        def descendants(pid: int) -> list[int]:
            todo, found = list(children.get(pid, [])), []
            while todo:
                p = todo.pop()
                found.append(p)
                todo.extend(children.get(p, []))
            return found

        cpu: dict[str, float] = {}
        for name, pid in self.roots.items():
            if pid not in table:
                continue
            own = table[pid]
            with contextlib.suppress(OSError, ValueError, IndexError):
                # Time the process's main thread was ready to run but waited for a CPU (the
                # scheduler's run queue): the machine's share, not the process's own cost.
                waited = int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
                cpu[f"{name} (waited)"] = waited
            if name in ("postgres", "tuner"):
                # The server's backends / the tuner's trials (and warm-start processes), live
                # and reaped.
                kids = descendants(pid)
                total = own[2] + own[3] + sum(table[k][2] + table[k][3] for k in kids)
                rss = own[4] + sum(table[k][4] for k in kids)
                if name == "tuner":
                    cpu["tuner"] = own[2]
                    cpu["trials"] = own[3] + sum(table[k][2] + table[k][3] for k in kids)
                    self.peak_rss["tuner"] = max(self.peak_rss["tuner"], own[4])
                    continue
                cpu[name] = total
                self.peak_rss[name] = max(self.peak_rss[name], rss)
            else:
                cpu[name] = own[2]
                self.peak_rss[name] = max(self.peak_rss[name], own[4])
        self.samples.append((time.monotonic(), cpu))

    def _loop(self) -> None:
        while not self._stop.wait(self.INTERVAL):
            with contextlib.suppress(Exception):
                self.sample()

    def start(self) -> None:
        self.sample()
        self._thread.start()

    def stop(self) -> dict[str, dict[str, float]]:
        self._stop.set()
        self._thread.join(timeout=10)
        with contextlib.suppress(Exception):
            self.sample()
        if len(self.samples) < 2:
            return {}
        t0, first = self.samples[0]
        t1, last = self.samples[-1]
        out: dict[str, dict[str, float]] = {}
        names = sorted({k for _, s in self.samples for k in s if not k.endswith(" (waited)")})
        for name in names:
            start = next((s[name] for _, s in self.samples if name in s), 0.0)
            used = last.get(name, start) - (first.get(name, start))
            peak = 0.0
            # The busiest ~10 s: CPU over 5 consecutive intervals.
            for i in range(len(self.samples) - 5):
                (ta, a), (tb, b) = self.samples[i], self.samples[i + 5]
                if name in a and name in b and tb > ta:
                    peak = max(peak, (b[name] - a[name]) / (tb - ta))
            out[name] = {"cpu_s": used, "mean_cores": used / (t1 - t0) if t1 > t0 else 0.0,
                         "peak_cores": peak,
                         "peak_rss_mib": self.peak_rss.get(name, 0) / 2**20}
            key = f"{name} (waited)"
            if key in last:
                waited_from = next((s[key] for _, s in self.samples if key in s), 0.0)
                out[name]["waited_s"] = last[key] - waited_from
        return out


# --- the people -------------------------------------------------------------------------------


class StepFailed(Exception):
    pass


@dataclass
class Call:
    step: str
    kind: str  # hub_api | tuner_api | server | hub_page
    ok: bool
    outcome: str  # the status, or the error's name
    seconds: float
    at: float  # seconds since the load began


@dataclass
class Recorder:
    began: float = field(default_factory=time.perf_counter)
    calls: list[Call] = field(default_factory=list)
    phases: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    phase_failures: dict[str, Counter[str]] = field(
        default_factory=lambda: defaultdict(Counter))
    sweeps: Counter[str] = field(default_factory=Counter)
    servers: int = 0
    peak_servers: int = 0

    def phase(self, name: str, seconds: float) -> None:
        self.phases[name].append(seconds)

    def phase_failed(self, name: str, why: str) -> None:
        self.phase_failures[name][why] += 1


def _kind(path: str) -> str:
    if path.startswith("/hub/api/"):
        return "hub_api"
    if path.startswith("/services/tuner/api/"):
        return "tuner_api"
    if path.startswith("/user/"):
        return "server"
    return "hub_page"


def source_address(i: int) -> str:
    """Person ``i``'s own loopback address: 127.1.0.1, 127.1.0.2, …"""
    return f"127.{1 + i // 62500}.{(i // 250) % 250}.{1 + i % 250}"


async def _call(rec: Recorder, session: Any, step: str, method: str, path: str,
                **kwargs: Any) -> tuple[int, bytes]:
    import aiohttp

    expected = REQUEST_STEPS[step][1]
    started = time.perf_counter()
    status, body, outcome = 0, b"", ""
    try:
        async with session.request(method, path, allow_redirects=False, **kwargs) as r:
            body = await r.read()
            status = r.status
            outcome = str(status)
    except TimeoutError:
        outcome = "timeout"
    except aiohttp.ClientError as exc:
        outcome = type(exc).__name__
    seconds = time.perf_counter() - started
    ok = status in expected
    rec.calls.append(Call(step, _kind(path), ok, outcome, seconds, started - rec.began))
    if not ok:
        raise StepFailed(f"{step}: {outcome} {body[:200]!r}")
    return status, body


def _xsrf(session: Any, base: str) -> str:
    from yarl import URL

    cookie = session.cookie_jar.filter_cookies(URL(f"{base}/hub/")).get("_xsrf")
    return cookie.value if cookie is not None else ""


def sweep_spec(name: str, i: int) -> dict[str, Any]:
    return {"name": f"hub-scale-{i}", "command": SWEEP_COMMAND, "metric": "score",
            "trials": 1, "parallelism": 1, "sampler": "random", "pruner": "none",
            "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}}}


@dataclass
class Person:
    i: int
    name: str
    password: str
    arrive: float
    leave: float
    submits: bool
    failed: str | None = None


async def _server_state(rec: Recorder, s: Any, name: str, auth: dict[str, str]) -> dict[str, Any]:
    _, body = await _call(rec, s, "spawn_poll", "GET", f"/hub/api/users/{name}", headers=auth)
    servers: dict[str, Any] = json.loads(body).get("servers") or {}
    return dict(servers.get("") or {})


async def simulate(base: str, person: Person, rec: Recorder, refresh: float) -> None:
    import aiohttp

    await asyncio.sleep(max(0.0, person.arrive - (time.perf_counter() - rec.began)))
    name = person.name
    connector = aiohttp.TCPConnector(local_addr=(source_address(person.i), 0), limit=4)
    spawned = stopped = False
    auth: dict[str, str] = {}
    async with aiohttp.ClientSession(
            base_url=base, connector=connector, cookie_jar=aiohttp.CookieJar(unsafe=True),
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)) as s:
        phase = "login"
        try:
            t = time.perf_counter()
            await _call(rec, s, "login_page", "GET", "/hub/login")
            await _call(rec, s, "login_post", "POST", "/hub/login", data={
                "username": name, "password": person.password, "_xsrf": _xsrf(s, base)})
            rec.phase("login", time.perf_counter() - t)
            phase = "token"
            _, body = await _call(rec, s, "token", "POST", f"/hub/api/users/{name}/tokens",
                                  json={"note": "hub_scale", "expires_in": 86400},
                                  headers={"X-XSRFToken": _xsrf(s, base)})
            auth = {"Authorization": f"token {json.loads(body)['token']}"}

            phase = "spawn"
            t = time.perf_counter()
            await _call(rec, s, "spawn_request", "POST", f"/hub/api/users/{name}/server",
                        json={}, headers=auth)
            spawned = True
            deadline = time.monotonic() + READY_TIMEOUT
            while True:
                server = await _server_state(rec, s, name, auth)
                if server.get("ready"):
                    break
                if not server.get("pending"):
                    raise StepFailed("spawn: the server stopped while starting")
                if time.monotonic() > deadline:
                    raise StepFailed(f"spawn: not ready within {READY_TIMEOUT:.0f} s")
                await asyncio.sleep(SPAWN_POLL)
            rec.phase("spawn", time.perf_counter() - t)
            rec.servers += 1
            rec.peak_servers = max(rec.peak_servers, rec.servers)

            phase = "use"
            await _call(rec, s, "server_status", "GET", f"/user/{name}/api/status", headers=auth)
            await _call(rec, s, "sweeps_list", "GET", "/services/tuner/api/v1/sweeps",
                        headers=auth)
            if person.submits:
                phase = "sweep"
                t = time.perf_counter()
                _, body = await _call(rec, s, "sweep_submit", "POST",
                                      "/services/tuner/api/v1/sweeps",
                                      json={"spec": sweep_spec(name, person.i)}, headers=auth)
                sweep_id = json.loads(body)["id"]
                rec.sweeps["submitted"] += 1
                deadline = time.monotonic() + SWEEP_TIMEOUT
                while True:
                    await asyncio.sleep(SWEEP_POLL)
                    _, body = await _call(rec, s, "sweep_get", "GET",
                                          f"/services/tuner/api/v1/sweeps/{sweep_id}",
                                          headers=auth)
                    state = json.loads(body).get("state")
                    if state in ("completed", "failed", "cancelled"):
                        break
                    if time.monotonic() > deadline:
                        raise StepFailed(f"sweep: still {state} after {SWEEP_TIMEOUT:.0f} s")
                rec.sweeps[str(state)] += 1
                if state != "completed":
                    raise StepFailed(f"sweep: ended {state}")
                rec.phase("sweep", time.perf_counter() - t)
                phase = "use"
            while True:
                now = time.perf_counter() - rec.began
                pause = refresh * random.uniform(0.5, 1.5)
                if now + pause >= person.leave:
                    await asyncio.sleep(max(0.0, person.leave - now))
                    break
                await asyncio.sleep(pause)
                await _call(rec, s, "sweeps_list", "GET", "/services/tuner/api/v1/sweeps",
                            headers=auth)
                await _call(rec, s, "server_status", "GET", f"/user/{name}/api/status",
                            headers=auth)
            phase = "stop"
            await _stop(rec, s, name, auth)
            stopped = True
        except (StepFailed, ValueError, KeyError) as exc:
            person.failed = f"{phase}: {exc}"[:300]
            rec.phase_failed(phase, str(exc).split(":", 1)[0] if isinstance(exc, StepFailed)
                             else type(exc).__name__)
        finally:
            if spawned and not stopped and auth:
                with contextlib.suppress(StepFailed, ValueError, KeyError):
                    await _stop(rec, s, name, auth)


async def _stop(rec: Recorder, s: Any, name: str, auth: dict[str, str]) -> None:
    t = time.perf_counter()
    await _call(rec, s, "stop_request", "DELETE", f"/hub/api/users/{name}/server", headers=auth)
    deadline = time.monotonic() + READY_TIMEOUT
    while (await _server_state(rec, s, name, auth)):
        if time.monotonic() > deadline:
            raise StepFailed(f"stop: still there after {READY_TIMEOUT:.0f} s")
        await asyncio.sleep(SPAWN_POLL)
    rec.phase("stop", time.perf_counter() - t)
    rec.servers -= 1


async def run_people(base: str, people: list[Person], refresh: float) -> Recorder:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    rec = Recorder()
    await asyncio.gather(*(simulate(base, p, rec, refresh) for p in people))
    return rec


# --- the benchmark --------------------------------------------------------------------------


def _summarise(calls: list[Call]) -> dict[str, Any]:
    ok = [c.seconds for c in calls if c.ok]
    fails = Counter(c.outcome for c in calls if not c.ok)
    return {**summary(ok), "n_ok": len(ok), "failed": sum(fails.values()),
            "failures": dict(fails.most_common())}


class HubScaleBenchmark(Benchmark):
    name = "hub_scale"
    title = "Hub at scale: a thousand people (issue 30)"

    def run(self, ctx: RunContext) -> dict[str, Any]:
        n = ctx.size("hub_scale_people", 20, 1000)
        window = float(ctx.size("hub_scale_window_s", 45, 600))
        submit_pct = ctx.size("hub_scale_submit_percent", 30, 30)
        want_pg = bool(ctx.size("hub_scale_postgres", 1, 1))
        hub_pg = bool(ctx.size("hub_scale_hub_postgres", 0, 0))
        seed = ctx.size("hub_scale_seed", 1, 1)
        rng = random.Random(seed)
        compression = SIMULATED_HOUR / window
        refresh = REFRESH_SIMULATED_S / compression

        home = ctx.scratch / "home"
        home.mkdir(parents=True, exist_ok=True)
        port = free_port()
        pg: LocalPostgres | None = None
        binaries = pg_bin() if want_pg or hub_pg else None
        if (want_pg or hub_pg) and binaries is None:
            raise NotMeasured("no PostgreSQL server binaries (initdb) here; set "
                              "TUNEHUB_BENCH_PG_BIN, or --set hub_scale_postgres=0")
        started = time.perf_counter()
        try:
            if binaries is not None:
                pg = LocalPostgres(ctx.scratch / "pg", binaries)
                ctx.log(f"hub_scale: PostgreSQL cluster in {pg.root}")
                try:
                    pg.start()
                except RuntimeError as exc:
                    raise NotMeasured(f"PostgreSQL did not start: {exc}") from None
            tuner_db = pg.create_database("tuner") if pg and want_pg else \
                f"sqlite:///{ctx.scratch / 'tuner.sqlite'}"
            hub_db = pg.create_database("jupyterhub") if pg and hub_pg else None
            env = hub_env(home, port, tuner_db, hub_db)
            from benchmarks.hub import state_dir

            state = state_dir(env)
            names = [f"p{i:04d}" for i in range(n)]
            ctx.log(f"hub_scale: {n} accounts (scrypt hashes)")
            passwords = create_accounts(state / "accounts.json", names)
            people = []
            for i, name in enumerate(names):
                people.append(Person(
                    i, name, passwords[name], arrive=rng.uniform(0, ARRIVE_UNTIL * window),
                    leave=rng.uniform(LEAVE_FROM * window, window),
                    submits=rng.random() < submit_pct / 100))
            with standin(ctx.scratch, ctx.scratch / "standin.log") as (sock, standin_proc):
                config = ctx.scratch / "hub_scale_config.py"
                config.write_text(HUB_CONFIG.format(
                    people=n, production=str(REPO / "jupyterhub_config.py"), socket=sock,
                    spawn_limit=CONCURRENT_SPAWN_LIMIT))
                ctx.log(f"hub_scale: tunehub up on port {port} (hub config {config})")
                setup_s = time.perf_counter() - started
                with tunehub_up(env, port, ctx.scratch / "up.log", config,
                                ready=("/hub/api/", "/services/tuner/api/v1/openapi.json"),
                                start_timeout=START_TIMEOUT, stop_timeout=300) as (url, _up):
                    hub_pid = None
                    with contextlib.suppress(OSError, ValueError):
                        hub_pid = int((state / "jupyterhub.pid").read_text().strip())
                    proxy_pid = None
                    with contextlib.suppress(OSError, ValueError):
                        proxy_pid = int((state / "proxy.pid").read_text().split()[0])
                    sampler = Sampler({"hub": hub_pid, "proxy": proxy_pid,
                                       "postgres": postmaster_pid(pg),
                                       "stand-in": standin_proc.pid, "load generator":
                                       os.getpid()})
                    sampler.start()
                    ctx.log(f"hub_scale: {n} people over {window:.0f} s "
                            f"(an hour compressed {compression:.0f}x)")
                    t0 = time.perf_counter()
                    rec = asyncio.run(run_people(url, people, refresh))
                    wall = time.perf_counter() - t0
                    processes = sampler.stop()
                    stand = standin_stats(sock)
                    load = list(os.getloadavg())
        finally:
            if pg is not None:
                pg.stop()
        return self._result(ctx, rec, people, wall, setup_s, processes, stand, load, {
            "people": n, "window_s": window, "compression": compression,
            "refresh_s": refresh, "submit_percent": submit_pct, "seed": seed,
            "tuner_db": "PostgreSQL" if pg and want_pg else "SQLite",
            "hub_db": "PostgreSQL" if hub_db else "SQLite",
            "pg_version": binaries.parent.name if binaries else None,
        })

    def _result(self, ctx: RunContext, rec: Recorder, people: list[Person], wall: float,
                setup_s: float, processes: dict[str, Any], stand: dict[str, Any],
                load: list[float], config: dict[str, Any]) -> dict[str, Any]:
        by_step: dict[str, list[Call]] = defaultdict(list)
        by_kind: dict[str, list[Call]] = defaultdict(list)
        for c in rec.calls:
            by_step[c.step].append(c)
            # The hub answers a spawn or stop request once it is done or after 10 s
            # (slow_spawn_timeout, slow_stop_timeout): its time is the spawn's or the stop's,
            # reported as such, not an API latency.
            by_kind["hub_spawn_stop" if c.step in WAITS else c.kind].append(c)
        failed_calls = sum(1 for c in rec.calls if not c.ok)
        failed_phases = sum(sum(v.values()) for v in rec.phase_failures.values())
        failed_people = [p for p in people if p.failed]
        # A failed call also fails its person's phase: people failed is the headline count;
        # failed requests and phases are the detail.
        return {
            **config,
            "wall_s": wall, "setup_s": setup_s,
            "requests": len(rec.calls), "requests_per_s": len(rec.calls) / wall if wall else 0,
            "steps": {s: _summarise(by_step.get(s, [])) for s in REQUEST_STEPS},
            "kinds": {k: _summarise(v) for k, v in by_kind.items()},
            "phases": {p: {**summary(rec.phases.get(p, [])),
                           "failures": dict(rec.phase_failures.get(p, {}))}
                       for p in PHASES},
            "failed_requests": failed_calls, "failed_phases": failed_phases,
            "failed_people": len(failed_people),
            "failure_reasons": [f"{p.name}: {p.failed}" for p in failed_people][:15],
            "sweeps": dict(rec.sweeps), "peak_servers_seen": rec.peak_servers,
            "standin": stand, "processes": processes, "load_average_end": load,
            "limits": limits(config["people"]),
        }

    def headline(self, result: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
        hub = result["kinds"].get("hub_api", {})
        tuner = result["kinds"].get("tuner_api", {})
        spawn = result["phases"].get("spawn", {})
        n = result["people"]
        return [
            (f"{n} people: 0 failures",
             f"{result['failed_people']} of {n} people failed ({result['failed_requests']} of "
             f"{result['requests']} requests)", result["failed_people"] == 0
             and result["failed_requests"] == 0),
            ("hub API p95 < 1 s", secs3(hub.get("p95")),
             _below(hub.get("p95"), TARGET_API_P95)),
            ("tuner API p95 < 1 s", secs3(tuner.get("p95")),
             _below(tuner.get("p95"), TARGET_API_P95)),
            ("spawn p95 reported", f"p50 {secs3(spawn.get('p50'))}, p95 "
             f"{secs3(spawn.get('p95'))}", None),
        ]

    def render(self, result: dict[str, Any]) -> str:
        n = result["people"]
        lines = [
            f"{n} simulated people over {result['window_s']:.0f} s (an hour of use compressed "
            f"{result['compression']:.0f}×) against `tunehub up --config` with the "
            "repository's production hub config (tunehub's authenticator and accounts, its "
            "proxy `python -m hub.proxy`, internal TLS with a certificate per person made at "
            "each spawn, the idle culler, the tuner service) and only the spawner swapped: "
            "each person's server is one real listening port of a single stand-in process "
            "(`_hub_standin.py`) that answers the hub's readiness check, checks tokens with the "
            "hub as `HubAuth` does and reports activity, so the hub's, the proxy's and the "
            f"tuner's cost is measured, not JupyterLab's. Tuner database: "
            f"{result['tuner_db']}"
            + (f" {result['pg_version']} (a fresh `initdb` cluster in scratch, fsync on)"
               if result["tuner_db"] == "PostgreSQL" else "")
            + f"; the hub's own database: {result['hub_db']}.",
            "",
            f"Each person, on a loopback address of its own, arrives uniformly in the first "
            f"{ARRIVE_UNTIL:.0%} of the window, logs in through the login form (password), "
            "creates an API token (cookie + XSRF), starts its server and polls until ready, "
            "checks it through the proxy, lists its sweeps; "
            f"{result['submit_percent']} % submit a one-trial sweep (`{SWEEP_COMMAND}` on the "
            f"local backend) and poll it every {SWEEP_POLL:.0f} s until it ends; every "
            f"{result['refresh_s']:.0f} s (5 simulated minutes) each lists its sweeps and "
            f"checks its server again; in the last {1 - LEAVE_FROM:.0%} each stops its server. "
            "A failure is any other status than the step's expected one, a connection error "
            f"or no answer within {REQUEST_TIMEOUT:.0f} s.",
            "",
            "| request | n ok | failures | p50 | p95 | max |",
            "|---|---|---|---|---|---|",
        ]
        for step, (what, _expected) in REQUEST_STEPS.items():
            s = result["steps"].get(step, {})
            lines.append(f"| {what} | {s.get('n_ok', 0)} | {_fails(s)} | {ms(s.get('p50'))} | "
                         f"{ms(s.get('p95'))} | {ms(s.get('max'))} |")
        lines += ["", "| per person | n ok | failures | p50 | p95 | max |",
                  "|---|---|---|---|---|---|"]
        for phase, what in PHASES.items():
            s = result["phases"].get(phase, {})
            fails = ", ".join(f"{k}: {v}" for k, v in s.get("failures", {}).items()) or "0"
            lines.append(f"| {what} | {s.get('n', 0)} | {fails} | {secs3(s.get('p50'))} | "
                         f"{secs3(s.get('p95'))} | {secs3(s.get('max'))} |")
        lines += ["", "| all requests to | n ok | failures | p50 | p95 | max |",
                  "|---|---|---|---|---|---|"]
        for kind, what in (("hub_api", "the hub's API (`/hub/api/`), but spawn and stop "
                                       "requests"),
                           ("hub_spawn_stop", "spawn and stop requests (the hub answers when "
                                              "done, or after 10 s)"),
                           ("tuner_api", "the tuner's API (`/services/tuner/api/`)"),
                           ("server", "people's servers (`/user/`)"),
                           ("hub_page", "the hub's pages (login)")):
            s = result["kinds"].get(kind, {})
            lines.append(f"| {what} | {s.get('n_ok', 0)} | {_fails(s)} | {ms(s.get('p50'))} | "
                         f"{ms(s.get('p95'))} | {ms(s.get('max'))} |")
        sw = result.get("sweeps", {})
        st = result.get("standin", {})
        lines += [
            "",
            f"Failures: {result['failed_people']} of {n} people, {result['failed_requests']} of "
            f"{result['requests']} requests ({result['requests_per_s']:.1f} requests/s). "
            f"Whole run {secs(result['wall_s'])} (set-up before it: accounts, PostgreSQL, "
            f"the stand-in: {secs(result['setup_s'])}). Sweeps: "
            f"{sw.get('submitted', 0)} submitted, {sw.get('completed', 0)} completed, "
            f"{sw.get('failed', 0)} failed. Servers running at once at most: "
            f"{st.get('peak', result.get('peak_servers_seen'))} (stand-in: "
            f"{st.get('started', 0)} started, {st.get('token_checks', 0)} token checks and "
            f"{st.get('activity_posts', 0)} activity reports to the hub, "
            f"{st.get('hub_errors', 0)} of them failed).",
        ]
        for reason in result.get("failure_reasons", []):
            lines.append(f"- {reason}")
        procs = result.get("processes", {})
        if procs:
            lines += ["", "What each part used over the run (from /proc: CPU, the busiest ~10 s, "
                      "time its main thread was ready to run but waited for a CPU, i.e. what the "
                      "machine's other load took from it, and peak resident memory):", "",
                      "| process | CPU s | mean cores | busiest cores | waited for a CPU | "
                      "peak RSS |", "|---|---|---|---|---|---|"]
            for name, p in procs.items():
                waited = f"{p['waited_s']:.0f} s" if "waited_s" in p else "–"
                lines.append(f"| {name} | {p['cpu_s']:.0f} | {p['mean_cores']:.2f} | "
                             f"{p['peak_cores']:.2f} | {waited} | {p['peak_rss_mib']:.0f} MiB |")
        lines += ["", "Limits the hub ran with, as a deployment for "
                  f"{n} people sets them:", ""]
        for key, value in result.get("limits", {}).items():
            lines.append(f"- `{key}`: {value}")
        lines += [
            "",
            "Targets (issue 30): 0 failures; hub and tuner API p95 < 1 s (the hub's: every "
            "`/hub/api/` request but the spawn and stop requests, which JupyterHub answers only "
            "when the spawn or stop is done or after 10 s, and whose time is the spawn's and "
            "the stop's); spawn p95 reported. "
            f"Reference: {REFERENCE}. Not measured here: JupyterLab itself (its start, its "
            "kernels, its own polling), the Node.js proxy, per-person system users "
            "(`TUNEHUB_UNIX_USERS=0`), and a load generator on another machine: the simulated "
            "people share this machine's cores with the platform.",
        ]
        return "\n".join(lines)


def secs3(seconds: float | None) -> str:
    if seconds is None or seconds != seconds:
        return "n/a"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _below(value: float | None, target: float) -> bool | None:
    if value is None or value != value:
        return None
    return value < target


def _fails(s: dict[str, Any]) -> str:
    fails = s.get("failures") or {}
    return ", ".join(f"{k}: {v}" for k, v in fails.items()) if fails else "0"
