"""Hub: N simulated users log in, start a server, start a kernel and run code at once, like
hubtraf, against ``tunehub up`` (local spawner) on free ports with a throw-away TUNEHUB_HOME.

Reports p50/p95 of each step and the failures. Users are spread over a short ramp-up, as hubtraf
does; their accounts are written to the hub's account file before it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks._base import Benchmark, NotMeasured, RunContext
from benchmarks._common import REPO, free_port, secs, summary

START_TIMEOUT = 180.0
RAMP_SECONDS_PER_USER = 0.2
STEPS = ("login", "spawn", "kernel", "code", "stop")


def hub_env(home: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TUNEHUB_") and k not in ("JUPYTERHUB_API_TOKEN",)}
    env.update({"TUNEHUB_HOME": str(home), "TUNEHUB_LOCAL_GPUS": "",
                "TUNEHUB_PORT": str(port), "PYTHONUNBUFFERED": "1",
                # Run as root, tunehub up would make a system user per simulated person and
                # leave them on the machine; the benchmark measures the hub, not isolation.
                "TUNEHUB_UNIX_USERS": "0"})
    return env


def state_dir(env: dict[str, str]) -> Path:
    """Where the hub keeps its state for this environment (asked of the hub's own options)."""
    out = subprocess.run(
        [sys.executable, "-c", "from hub.options import TunehubHub; print(TunehubHub().state_dir)"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )
    if out.returncode != 0:
        raise NotMeasured(f"the hub's options do not load: {out.stderr.strip()[-300:]}")
    return Path(out.stdout.strip())


def create_users(accounts_file: Path, n: int) -> dict[str, str]:
    from tunehub_base.accounts import AccountStore, random_password

    accounts_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    store = AccountStore(accounts_file)
    users = {f"bench{i:03d}": random_password() for i in range(n)}
    for name, password in users.items():
        store.create(name, password)
    return users


@contextlib.contextmanager
def tunehub_up(env: dict[str, str], port: int, log: Path, config: Path | None = None,
               ready: tuple[str, ...] = ("/hub/api/",), start_timeout: float = START_TIMEOUT,
               stop_timeout: float = 120.0) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``tunehub up`` (with ``--config CONFIG``) in a process group of its own; yields its URL
    and process once every path in ``ready`` answers 200 through the proxy. Stopped with
    SIGTERM (it stops every server through the hub, then the hub)."""
    import httpx

    argv = [sys.executable, "-m", "tuner.cli", "up", "--port", str(port)]
    if config is not None:
        argv += ["--config", str(config)]
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, cwd=env["TUNEHUB_HOME"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout
        for path in ready:
            while True:
                if proc.poll() is not None:
                    tail = log.read_text(errors="replace").strip().splitlines()[-5:]
                    raise NotMeasured(f"`tunehub up` exited with {proc.returncode}: "
                                      + " / ".join(tail))
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{url}{path}", timeout=5).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise NotMeasured(f"`tunehub up` did not answer {path} within "
                                      f"{start_timeout:.0f} s")
                time.sleep(0.5)  # poll interval while the platform starts
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=stop_timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


async def _all(url: str, users: dict[str, str]) -> list[Any]:
    from benchmarks._hubtraf import simulate

    return await asyncio.gather(*(
        simulate(url, name, pw, i * RAMP_SECONDS_PER_USER)
        for i, (name, pw) in enumerate(users.items())
    ))


class HubBenchmark(Benchmark):
    name = "hub"
    title = "Hub: simulated users (hubtraf-style)"

    def run(self, ctx: RunContext) -> dict[str, Any]:
        from benchmarks._hubtraf import as_json

        n = ctx.size("hub_users", 3, 50)
        home = ctx.scratch / "home"
        home.mkdir(parents=True, exist_ok=True)
        port = free_port()
        env = hub_env(home, port)
        users = create_users(state_dir(env) / "accounts.json", n)
        ctx.log(f"hub: tunehub up on port {port}, {n} users")
        with tunehub_up(env, port, ctx.scratch / "up.log") as (url, _up):
            t0 = time.perf_counter()
            runs = asyncio.run(_all(url, users))
            wall = time.perf_counter() - t0
        per_step = {s: summary([r.steps[s] for r in runs if s in r.steps]) for s in STEPS}
        failures = [r for r in runs if r.failed]
        return {"users": n, "wall_s": wall, "steps": per_step, "failures": len(failures),
                "failure_reasons": sorted({r.failed or "" for r in failures})[:10],
                "runs": as_json(runs), "ramp_s": n * RAMP_SECONDS_PER_USER}

    def headline(self, result: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
        spawn = result["steps"].get("spawn", {})
        return [
            (f"{result['users']} concurrent users: spawn p50/p95",
             f"{secs(spawn.get('p50'))} / {secs(spawn.get('p95'))}", None),
            ("0 failures", f"{result['failures']} of {result['users']} users failed",
             result["failures"] == 0),
        ]

    def render(self, result: dict[str, Any]) -> str:
        lines = [
            f"{result['users']} users against `tunehub up` (local spawner, SQLite, "
            f"configurable-http-proxy), started over {result['ramp_s']:.0f} s. Each logs in "
            "through the login form, gets an API token, starts its server (polling until "
            "ready), starts a kernel, runs code over the kernel websocket and checks the "
            "output, then stops the kernel and the server. No peer: this measures the hub "
            "tunehub ships (JupyterHub itself) on this machine.",
            "",
            "| step | n ok | p50 | p95 | max |",
            "|---|---|---|---|---|",
        ]
        for step in STEPS:
            s = result["steps"].get(step, {})
            if not s.get("n"):
                lines.append(f"| {step} | 0 | | | |")
                continue
            lines.append(f"| {step} | {s['n']} | {secs(s['p50'])} | {secs(s['p95'])} | "
                         f"{secs(s['max'])} |")
        lines += ["", f"Failures: {result['failures']} of {result['users']} users; whole run "
                      f"{secs(result['wall_s'])}."]
        for reason in result.get("failure_reasons", []):
            lines.append(f"- {reason}")
        lines += ["", "Target (issue 6): p50/p95 spawn time reported, 0 failures."]
        return "\n".join(lines)
