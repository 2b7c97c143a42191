"""The hub can be restarted (killed, or stopped and started again) without taking people's work
with it: on one machine as JupyterHub documents for upgrades ("Upgrading JupyterHub without
shutting down user servers"), done here for ``tunehub up``.

- The notebook servers run on (``JupyterHub.cleanup_servers = False``); each is in its own
  session (LocalProcessSpawner), and the next hub finds it by the pid kept in its database.
- The proxy runs on (``cleanup_proxy = False``) with the routes it holds, and the next hub
  adopts it (:class:`AdoptingProxy`) instead of stopping it and starting an empty one, which is
  JupyterHub's behaviour for a proxy left by an earlier hub. Its API token is kept in the hub's
  root-only state directory, so the next hub can talk to it.
- ``tunehub up`` is the one that stops everything on Ctrl-C: before stopping the hub it stops
  every server through the hub's API, as the service ``tunehub-up`` (its token is a file that
  ``tunehub up`` writes afresh each run, in the same directory), then stops the proxy.

- The tuner runs on too, with its sweeps and their running trials: what the hub manages is a
  stand-in for a keeper detached from it (:mod:`tuner.detached_keeper`), which the next hub's
  stand-in finds; ``tunehub up`` stops that keeper on Ctrl-C, after the hub.

The culler is a child of the hub: the hub stops it when it stops, and it exits when the hub is
killed (``die_with_parent``), so the next hub can start it again. A hub started otherwise than by
``tunehub up`` (no stopper token) manages its tuner as before: the tuner stops with it, and its
controllers resume their sweeps when the next hub starts it.
"""

from __future__ import annotations

import os
import secrets
import signal
from pathlib import Path
from typing import Any

from jupyterhub.proxy import ConfigurableHTTPProxy
from tornado.ioloop import PeriodicCallback

from hub import tuner_service
from tunehub_base.pid_files import TUNER_KEEPER_PID_FILE, TUNER_OUTLIVES_HUB, recorded_process
from tunehub_base.process_identity import ProcessIdentity

#: The service ``tunehub up`` acts as when it stops everyone's servers.
STOPPER = "tunehub-up"
STOPPER_TOKEN_FILE = "up-token"
PROXY_TOKEN_FILE = "proxy-auth-token"
PROXY_MARKER = b"hub.proxy"
TUNER_TOKEN_FILE = "tuner-token"


def secret_file(path: Path) -> str:
    """The token in ``path`` (created, owner-only, when missing)."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        token = secrets.token_hex(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(token)
        return token


def configure(c: Any, state: Path) -> None:
    """Servers and proxy outlive the hub; the next hub adopts them."""
    c.JupyterHub.cleanup_servers = False
    c.JupyterHub.cleanup_proxy = False
    c.JupyterHub.proxy_class = AdoptingProxy
    c.ConfigurableHTTPProxy.auth_token = secret_file(state / PROXY_TOKEN_FILE)
    stopper = state / STOPPER_TOKEN_FILE
    if stopper.is_file():  # written by ``tunehub up``; a hub started otherwise has no stopper
        c.JupyterHub.services.append({"name": STOPPER, "api_token": stopper.read_text().strip()})
        c.JupyterHub.load_roles.append({
            "name": STOPPER, "description": "tunehub up stops every server on Ctrl-C",
            "scopes": ["list:users", "admin:servers"], "services": [STOPPER]})
        _tuner_outlives_hub(c, state)


def _tuner_outlives_hub(c: Any, state: Path) -> None:
    """Under ``tunehub up`` (our parent, which stops the tuner on Ctrl-C) the default tuner
    command runs detached from the hub (:mod:`tuner.detached_keeper`), with an API token that
    is the same on every start of the hub: the running service keeps the one it was given."""
    for service in c.JupyterHub.services:
        if service.get("name") == tuner_service.SERVICE_NAME and (
                service.get("command") == tuner_service.default_command()):
            try:
                up = ProcessIdentity.of(os.getppid()).line()
            except ProcessLookupError:
                return
            service["command"] = [*service["command"], TUNER_OUTLIVES_HUB,
                                  str(state / TUNER_KEEPER_PID_FILE), up]
            service["api_token"] = secret_file(state / TUNER_TOKEN_FILE)


class _Adopted:
    """The parts of ``Popen`` JupyterHub uses, for a proxy another hub started."""

    def __init__(self, identity: ProcessIdentity) -> None:
        self.identity = identity
        self.pid = identity.pid

    def poll(self) -> int | None:
        return None if self.identity.alive() is not False else 1

    def terminate(self) -> None:
        if self.identity.alive():
            os.kill(self.pid, signal.SIGTERM)


class AdoptingProxy(ConfigurableHTTPProxy):
    """configurable-http-proxy that adopts a running proxy left by an earlier hub (its pid file
    names it, and it answers its API with our token) with the routes it holds; otherwise
    starts one as usual. JupyterHub then checks the routes against its database as always."""

    async def start(self) -> None:
        previous = recorded_process(Path(self.pid_file), PROXY_MARKER) if self.pid_file else None
        if previous is not None:
            try:
                routes = await self.get_all_routes()
            except Exception as exc:  # not ours, or not answering: JupyterHub replaces it
                self.log.warning("Proxy at pid=%s does not answer (%s); replacing it",
                                 previous.pid, exc)
            else:
                self.log.info("Adopting the running proxy at pid=%s with its %d routes",
                              previous.pid, len(routes))
                self.proxy_process = _Adopted(previous)
                pc = PeriodicCallback(self.check_running, 1e3 * self.check_running_interval)
                self._check_running_callback = pc
                pc.start()
                return
        await super().start()
