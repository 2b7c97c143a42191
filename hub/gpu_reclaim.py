"""Idle GPUs given back: the hub's half (policy, the reports' endpoint, the stop and its reason).

A notebook server measures its own GPUs (:mod:`hub.singleuser.gpu_reclaim`, the same sampler
as the tuner's) and reports each reading here with its own token
(``POST /hub/api/tunehub/gpu-use/<user>``, scope ``users:activity`` of that user, which every
server token carries). The answer carries the policy (these traitlets), so a server follows
the hub's settings without a restart. When the server says its GPUs stayed unused past the
warning *and* the further wait, with no cell running, the hub stops it (the GPUs go back to the
pool as with any stop) and keeps the reason, which the person reads on the hub's home page.

Why the hub stops it, not the server itself: a stop through the hub is a stop everyone knows
(spawner, pool, proxy), and the reason lives with the hub, where the person looks next. Why the
server measures: in a pod only the pod sees its GPUs' pids; on one machine it is the same code.

Exempt people and groups (``exempt``) are answered ``exempt: true``: their servers are never
warned nor stopped for idle GPUs. Reasons are kept in the hub's state directory
(:mod:`hub.gpu_reclaim_reasons`), so a restarted hub still tells the person why; the latest
reports are kept in memory only while their server keeps reporting (a stopped server's is
dropped at its stop, or once it is :data:`STALE_SAMPLES` readings late).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from jupyterhub.apihandlers.base import APIHandler
from jupyterhub.scopes import needs_scope
from prometheus_client import Counter
from tornado import web
from traitlets import Float, List, Unicode, default
from traitlets.config import Configurable

from hub.gpu_reclaim_reasons import StopReasons
from tunehub_base.gpu_meter import number_setting
from tunehub_base.options import setting

#: The endpoint, under the hub's prefix (``/hub/``).
ROUTE = r"/api/tunehub/gpu-use/([^/]+)"
#: What the home page shows (``template_vars``).
TEMPLATE_VAR = "tunehub_stop_reason"
MAX_READINGS = 16  # GPUs one report may carry
MAX_BODY = 64 * 1024  # bytes of one report (kept in the hub's memory)
STALE_SAMPLES = 10  # readings missed before a server's report counts as gone

#: On the hub's own ``/hub/metrics`` (JupyterHub's registry is prometheus_client's default).
RECLAIMED = Counter("tunehub_gpu_servers_reclaimed",
                    "Notebook servers stopped because their GPUs stayed unused")


class GpuReclaim(Configurable):
    """When a GPU notebook server counts as idle, and what happens then."""

    warn_after = Float(
        help="Seconds a GPU server's GPUs may stay unused before the person is warned inside "
             "JupyterLab; 0 turns reclaiming off (TUNEHUB_GPU_RECLAIM_WARN_SECONDS)."
    ).tag(config=True)

    reclaim_after = Float(
        help="Seconds after the warning, GPUs still unused, before the server is stopped "
             "(never while a cell runs) (TUNEHUB_GPU_RECLAIM_AFTER_SECONDS)."
    ).tag(config=True)

    busy_percent = Float(
        help="Utilisation (percent) from which a GPU counts as used even with no process on "
             "it (TUNEHUB_GPU_BUSY_PERCENT)."
    ).tag(config=True)

    sample_seconds = Float(
        help="Seconds between two readings of a server's GPUs (TUNEHUB_GPU_SAMPLE_SECONDS)."
    ).tag(config=True)

    exempt = List(
        Unicode(),
        help="People (NAME) and groups (group:NAME) whose idle GPU servers are never reclaimed "
             "(TUNEHUB_GPU_RECLAIM_EXEMPT, comma separated).",
    ).tag(config=True)

    @default("warn_after")
    def _warn_after(self) -> float:
        return number_setting("TUNEHUB_GPU_RECLAIM_WARN_SECONDS")

    @default("reclaim_after")
    def _reclaim_after(self) -> float:
        return number_setting("TUNEHUB_GPU_RECLAIM_AFTER_SECONDS")

    @default("busy_percent")
    def _busy_percent(self) -> float:
        return number_setting("TUNEHUB_GPU_BUSY_PERCENT")

    @default("sample_seconds")
    def _sample_seconds(self) -> float:
        return max(0.2, number_setting("TUNEHUB_GPU_SAMPLE_SECONDS"))

    @default("exempt")
    def _exempt(self) -> list[str]:
        raw = setting("TUNEHUB_GPU_RECLAIM_EXEMPT").read() or ""
        return [item.strip() for item in raw.split(",") if item.strip()]

    def is_exempt(self, name: str, groups: list[str]) -> bool:
        return name in self.exempt or any(f"group:{g}" in self.exempt for g in groups)

    def policy(self, exempt: bool) -> dict[str, Any]:
        """What a notebook server follows (its half of the rule)."""
        return {"warn_after": self.warn_after, "reclaim_after": self.reclaim_after,
                "busy_threshold": self.busy_percent / 100, "sample_seconds": self.sample_seconds,
                "enabled": self.warn_after > 0 and not exempt, "exempt": exempt}


class Ledger:
    """The latest report of each running server (memory) and the reasons of reclaimed ones
    (:class:`~hub.gpu_reclaim_reasons.StopReasons`, kept on disk once :func:`configure` names
    the hub's state directory)."""

    def __init__(self) -> None:
        self.reports: dict[tuple[str, str], dict[str, Any]] = {}
        self.stopped = StopReasons()

    def keep_report(self, user: str, server: str, report: dict[str, Any],
                    sample_seconds: float) -> None:
        """The server's latest report; every report gone stale is dropped meanwhile."""
        now = report["at"]
        stale = now - max(60.0, STALE_SAMPLES * sample_seconds)
        for key in [k for k, r in self.reports.items() if r["at"] < stale]:
            del self.reports[key]
        self.reports[(user, server)] = report

    def reason_for(self, user: Any) -> str:
        """The home page's note: why the person's server was stopped, while it is not running
        again (``template_vars`` calls this with the current user)."""
        if user is None:
            return ""
        stopped = self.stopped.get(user.name)
        if stopped is None:
            return ""
        if user.spawner.active:
            return ""  # started again: the note is past
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(stopped.at))
        return f"{stopped.reason} ({when})"


LEDGER = Ledger()


def reason_for(user: Any) -> str:
    """:meth:`Ledger.reason_for` of the hub's one ledger: a plain function, because the config
    deep-copies what it holds (a bound method would take a copy of the ledger with it)."""
    return LEDGER.reason_for(user)


def _body(handler: APIHandler) -> dict[str, Any]:
    if len(handler.request.body or b"") > MAX_BODY:
        raise web.HTTPError(400, f"body: over {MAX_BODY} bytes")
    try:
        body = json.loads(handler.request.body or b"{}")
    except ValueError:
        raise web.HTTPError(400, "body: not JSON") from None
    if not isinstance(body, dict):
        raise web.HTTPError(400, "body: not a JSON object")
    server = body.get("server", "")
    readings = body.get("readings", [])
    if not isinstance(server, str):
        raise web.HTTPError(400, "server: not a string")
    if not isinstance(readings, list) or len(readings) > MAX_READINGS or not all(
            isinstance(r, dict) for r in readings):
        raise web.HTTPError(400, f"readings: a list of at most {MAX_READINGS} objects")
    for field in ("state", "note"):
        if not isinstance(body.get(field, ""), str) or len(body.get(field, "")) > 1000:
            raise web.HTTPError(400, f"{field}: a string of at most 1000 characters")
    if not isinstance(body.get("reclaim", False), bool):
        raise web.HTTPError(400, "reclaim: not a boolean")
    return body


class GpuUseHandler(APIHandler):
    """A server's GPU report in, the policy out; a reclaim asked for, the server stopped."""

    def _user(self, user_name: str) -> Any:
        user = self.find_user(user_name)
        if user is None:
            raise web.HTTPError(404, "user: no such user")
        return user

    def _config(self) -> GpuReclaim:
        return GpuReclaim(config=self.settings["config"])

    @needs_scope("read:users:activity")
    async def get(self, user_name: str) -> None:
        user = self._user(user_name)
        config = self._config()
        exempt = config.is_exempt(user.name, [g.name for g in user.groups])
        reports = {s: r for (u, s), r in LEDGER.reports.items() if u == user.name}
        for server in [s for s in reports if not _running(user, s)]:
            del reports[server]  # stopped before its report went stale
            LEDGER.reports.pop((user.name, server), None)
        stopped = LEDGER.stopped.get(user.name)
        self.write(json.dumps({"policy": config.policy(exempt), "servers": reports,
                               "stopped": stopped.__dict__ if stopped else None}))

    @needs_scope("users:activity")
    async def post(self, user_name: str) -> None:
        user = self._user(user_name)
        body = _body(self)
        server = body.get("server", "")
        spawner = user.spawners[server] if server in user.orm_spawners else None
        if spawner is None:
            raise web.HTTPError(400, f"server: {user.name} has no server {server!r}")
        config = self._config()
        exempt = config.is_exempt(user.name, [g.name for g in user.groups])
        LEDGER.keep_report(user.name, server, {
            "readings": body.get("readings", []), "state": body.get("state", ""),
            "note": body.get("note", ""), "at": time.time()}, config.sample_seconds)
        if spawner.active and not spawner.pending:
            LEDGER.stopped.forget(user.name)  # running again: the last reason is past
        answer: dict[str, Any] = {"policy": config.policy(exempt), "stopping": False}
        if body.get("reclaim") and config.policy(exempt)["enabled"] and spawner.active \
                and not spawner.pending:
            reason = (f"Your server was stopped to give its GPUs back: "
                      f"{body.get('note') or 'they stayed unused'}. Start it again when you "
                      "need a GPU; your files are kept.")
            LEDGER.stopped.keep(user.name, reason, time.time())
            LEDGER.reports.pop((user.name, server), None)
            self.log.warning("tunehub: reclaiming %s's GPU server %r: %s", user.name, server,
                             body.get("note"))
            # Not awaited: the server that asked is the one stopping (its request must end).
            asyncio.ensure_future(self.stop_single_user(user, server))
            RECLAIMED.inc()
            answer["stopping"] = True
        self.set_status(200)
        self.write(json.dumps(answer))


def _running(user: Any, server: str) -> bool:
    spawner = user.spawners[server] if server in user.orm_spawners else None
    return bool(spawner and spawner.active)


def configure(c: Any, state_dir: str | Path | None = None) -> None:
    """The endpoint and the home page's note (``c.GpuReclaim.*`` hold the policy); reasons
    are kept in ``state_dir`` (the hub's own directory), in memory only without one."""
    LEDGER.stopped = StopReasons(state_dir)
    c.JupyterHub.extra_handlers = [*c.JupyterHub.get("extra_handlers", []),
                                   (ROUTE, GpuUseHandler)]
    c.JupyterHub.template_vars = {**c.JupyterHub.get("template_vars", {}),
                                  TEMPLATE_VAR: reason_for}
