"""Inside a notebook server: measure its own GPUs, warn the person, ask the hub to reclaim them.

Why here: the server is the one place that knows both its GPUs (``CUDA_VISIBLE_DEVICES`` as the
local spawner sets it; in a pod, every GPU NVML shows it) and whether a cell is running
(:func:`hub.singleuser.busy_activity.busy_kernels`, the culler's busy rule). It reads them with
the platform's sampler (:mod:`tunehub_base.gpu_usage`) and reports each reading to the hub with
its own token (:mod:`hub.gpu_reclaim`), whose answer carries the policy.

The rule (:class:`IdleClock`): GPUs unused (no process on any, utilisation under the threshold)
for ``warn_after`` seconds: the person is warned inside JupyterLab, by a warning notification
(:mod:`hub.singleuser.lab_notice`, whose extension reads :meth:`Reclaimer.status`) and by a
notice file at the top of their file browser (:data:`NOTICE`), both gone as soon as a GPU is
used again; still unused
``reclaim_after`` seconds later and no cell running: the server asks the hub to stop it. A GPU
without figures (no NVML, a lost GPU) is reported with the reason and never counts as unused.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hub.singleuser import lab_notice
from tunehub_base.gpu_usage import GpuReading, Sampler, nvml_gpus

NOTICE = "GPU-IDLE-NOTICE.txt"
NO_GPUS = {"", "none", "void", "NoDevFiles"}


def own_gpus(environ: dict[str, str] | None = None) -> list[str] | None:
    """The GPU ids this server was given; None: every GPU NVML shows (a pod's own)."""
    env = os.environ if environ is None else environ
    cuda = env.get("CUDA_VISIBLE_DEVICES")
    if cuda is not None:
        return [] if cuda.strip() in NO_GPUS else [g.strip() for g in cuda.split(",") if g.strip()]
    nvidia = env.get("NVIDIA_VISIBLE_DEVICES")
    if nvidia is None or nvidia.strip() in NO_GPUS:
        return []
    return None


def visible_gpus(sampler: Sampler, declared: list[str] | None) -> list[str]:
    """``declared``, or the indices of every device NVML shows this process."""
    if declared is not None:
        return declared
    found = nvml_gpus()
    return ["0"] if found is None else found  # measured as GPU 0: its reading says why


@dataclass
class Policy:
    warn_after: float = 0.0
    reclaim_after: float = 0.0
    busy_threshold: float = 0.05
    sample_seconds: float = 10.0
    enabled: bool = False

    @classmethod
    def from_answer(cls, answer: dict[str, Any]) -> Policy:
        p = answer.get("policy") or {}
        return cls(float(p.get("warn_after", 0)), float(p.get("reclaim_after", 0)),
                   float(p.get("busy_threshold", 0.05)), float(p.get("sample_seconds", 10)),
                   bool(p.get("enabled", False)))


@dataclass
class IdleClock:
    """How long the GPUs have gone unused, and what that calls for."""

    idle_since: float | None = None
    warned_at: float | None = None

    def step(self, readings: list[GpuReading], now: float, cell_running: bool,
             policy: Policy) -> str:
        """One of ``in use``, ``unmeasured``, ``not reclaimed`` (off, or exempt), ``idle``,
        ``warn`` (warn now), ``warned``, ``cell running`` (due, but a cell runs), ``reclaim``."""
        busy = [r.busy(policy.busy_threshold) for r in readings]
        if not policy.enabled or any(b is None for b in busy) or any(busy):
            self.idle_since = self.warned_at = None
            if any(b is None for b in busy):
                return "unmeasured"
            return "in use" if any(busy) else "not reclaimed"
        if self.idle_since is None:
            self.idle_since = now
        if self.warned_at is None:
            if now - self.idle_since < policy.warn_after:
                return "idle"
            self.warned_at = now
            return "warn"
        if now - self.warned_at < policy.reclaim_after:
            return "warned"
        return "cell running" if cell_running else "reclaim"


def notice_text(policy: Policy) -> str:
    return (
        "tunehub: this notebook server's GPUs have not been used for "
        f"{policy.warn_after:g} seconds (no process on them, utilisation under "
        f"{policy.busy_threshold:.0%}).\n\n"
        f"If they stay unused for {policy.reclaim_after:g} more seconds, the server will be "
        "stopped to give them back to the shared pool (never while a cell runs). Your files "
        "are kept.\n\nUse the GPU (run a cell that computes on it) to keep it: this notice "
        "then goes away.\n")


def _duration(seconds: float) -> str:
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:g} s"


def lab_message(policy: Policy) -> str:
    """The notification's text: one line, short enough for JupyterLab's toast (140 characters)."""
    return (f"GPUs unused for {_duration(policy.warn_after)}: this server stops in "
            f"{_duration(policy.reclaim_after)} to give them back (never mid-cell; files kept). "
            "Use a GPU to keep it.")


def describe(readings: list[GpuReading]) -> str:
    """One line for the hub and the log: each GPU's figures or why there are none."""
    parts = []
    for r in readings:
        if r.absent is not None:
            parts.append(f"GPU {r.gpu}: {r.absent}")
        else:
            parts.append(f"GPU {r.gpu}: {(r.utilization or 0):.0%} utilisation, "
                         f"{len(r.pids)} process(es)")
    return "; ".join(parts)


class Reclaimer:
    """The loop: sample, step the clock, act on its answer, report to the hub."""

    def __init__(self, serverapp: Any, busy: Any) -> None:
        self.app = serverapp
        self.busy = busy  # () -> bool: a cell is running
        self.sampler = Sampler()
        self.clock = IdleClock()
        self.policy = Policy()
        self.declared = own_gpus()
        self.notice = Path(serverapp.root_dir) / NOTICE
        self.last_note = ""
        self.gpus: list[str] | None = None  # None: not known yet
        self.state = ""
        self.message = ""  # the warning, while warned

    def status(self) -> dict[str, Any]:
        """What JupyterLab shows (:mod:`hub.singleuser.lab_notice`)."""
        return {"gpus": self.gpus, "state": self.state, "message": self.message,
                "poll_seconds": max(1.0, min(self.policy.sample_seconds, 30.0))}

    async def run(self) -> None:
        gpus = await asyncio.to_thread(visible_gpus, self.sampler, self.declared)
        self.gpus = gpus
        if not gpus:
            return  # a CPU server: nothing to measure or give back
        self.app.log.info("tunehub: measuring this server's GPUs %s", ",".join(gpus))
        while True:
            try:
                await self.once(gpus)
            except Exception as exc:  # a fault never ends the loop nor the server
                self.app.log.warning("tunehub: GPU use not reported this time: %s", exc)
            await asyncio.sleep(max(0.2, self.policy.sample_seconds))

    async def once(self, gpus: list[str]) -> None:
        readings = list((await asyncio.to_thread(self.sampler.sample, gpus)).values())
        state = self.clock.step(readings, time.time(), self.busy(), self.policy)
        if state == "warn":
            self.message = lab_message(self.policy)
        elif state not in ("warned", "cell running", "reclaim"):
            self.message = ""
        self.state = state
        note = describe(readings)
        try:  # a notice that cannot be written never holds back the report
            if state == "warn":
                self.notice.write_text(notice_text(self.policy))
            elif state in ("in use", "unmeasured", "not reclaimed"):
                self.notice.unlink(missing_ok=True)
        except OSError as exc:
            self.app.log.warning("tunehub: the GPU notice in %s: %s", self.notice.parent, exc)
        if state == "warn":
            self.app.log.warning("tunehub: GPUs unused, warned (%s)", note)
        if state == "unmeasured" and note != self.last_note:
            self.app.log.warning("tunehub: GPU use not measured: %s", note)
        self.last_note = note
        idle_for = time.time() - self.clock.idle_since if self.clock.idle_since else 0
        if state == "reclaim":
            note = (f"its GPUs were not used for {idle_for:.0f} seconds "
                    f"(utilisation under {self.policy.busy_threshold:.0%}, no process on them)")
        answer = await self.report({
            "server": os.environ.get("JUPYTERHUB_SERVER_NAME", ""), "state": state,
            "note": note, "reclaim": state == "reclaim",
            "readings": [r.to_json() for r in readings]})
        self.policy = Policy.from_answer(answer)

    async def report(self, body: dict[str, Any]) -> dict[str, Any]:
        from jupyterhub.utils import make_ssl_context
        from tornado.httpclient import AsyncHTTPClient

        env = os.environ
        user = env["JUPYTERHUB_USER"]
        url = f"{env['JUPYTERHUB_API_URL'].rstrip('/')}/tunehub/gpu-use/{user}"
        ssl = make_ssl_context(env.get("JUPYTERHUB_SSL_KEYFILE"),
                               env.get("JUPYTERHUB_SSL_CERTFILE"),
                               cafile=env.get("JUPYTERHUB_SSL_CLIENT_CA"))
        response = await AsyncHTTPClient().fetch(
            url, method="POST", body=json.dumps(body), request_timeout=30,
            headers={"Authorization": f"token {env['JUPYTERHUB_API_TOKEN']}",
                     "Content-Type": "application/json"},
            **({"ssl_options": ssl} if ssl else {}))
        return dict(json.loads(response.body))


def start(serverapp: Any, busy: Any) -> None:
    """Run the loop on the server's event loop (kept, so it is not collected)."""
    if "JUPYTERHUB_API_TOKEN" not in os.environ:
        return  # not a hub's server
    reclaimer = Reclaimer(serverapp, busy)
    serverapp.web_app.settings[lab_notice.SETTING] = (
        reclaimer, asyncio.ensure_future(reclaimer.run()))
