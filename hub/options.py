"""The hub's own settings: where it listens, where it keeps state, how long servers may idle.

Every option reads a ``TUNEHUB_*`` environment variable by default (so ``tunehub up``, a
container or a Helm chart can set it) and can also be set in a hub config file as
``c.TunehubHub.<option>``.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from traitlets import Enum, Int, List, Unicode, default
from traitlets.config import Configurable

from tuner.settings import Settings, load_settings


def _env_int(name: str, fallback: int) -> int:
    raw = os.environ.get(name)
    if not raw:
        return fallback
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}: expected a whole number, got {raw!r}") from None


class TunehubHub(Configurable):
    """Settings of the tunehub JupyterHub (both modes)."""

    mode = Enum(
        ["local", "kubernetes"],
        help="Where notebook servers run: local processes on this machine, or pods "
        "(TUNEHUB_MODE).",
    ).tag(config=True)

    ip = Unicode(help="Address the public proxy listens on (TUNEHUB_IP).").tag(config=True)

    port = Int(help="Port of the public proxy: the URL people open (TUNEHUB_PORT).").tag(
        config=True
    )

    hub_port = Int(help="Port of the hub process behind the proxy (TUNEHUB_HUB_PORT).").tag(
        config=True
    )

    proxy_api_port = Int(
        help="Port of the proxy's REST API, loopback only (TUNEHUB_PROXY_API_PORT)."
    ).tag(config=True)

    tuner_port = Int(
        help="Port of the tuner service, loopback only; reached through the proxy at "
        "/services/tuner/ (TUNEHUB_TUNER_PORT)."
    ).tag(config=True)

    state_dir = Unicode(
        help="Directory of the hub's state: its database, cookie secret, accounts "
        "(TUNEHUB_HUB_STATE; default $TUNEHUB_HOME/hub).",
    ).tag(config=True)

    db_url = Unicode(
        help="The hub's own database (TUNEHUB_HUB_DB_URL; default SQLite in state_dir). "
        "Separate from the tuner's database (TUNEHUB_DB_URL).",
    ).tag(config=True)

    cpu_idle_timeout = Int(
        help="Seconds a CPU-only notebook server may idle before it is stopped "
        "(TUNEHUB_CPU_IDLE_TIMEOUT, default 7200). 0 disables the idle culler.",
    ).tag(config=True)

    gpu_idle_timeout = Int(
        help="Seconds a notebook server holding GPUs may idle before it is stopped, so idle "
        "GPUs go back to the pool (TUNEHUB_GPU_IDLE_TIMEOUT, default 1800).",
    ).tag(config=True)

    cull_every = Int(
        help="Seconds between idle checks (TUNEHUB_CULL_EVERY; 0: half the shorter timeout)."
    ).tag(config=True)

    activity_interval = Int(
        help="Seconds between a notebook server's activity reports to the hub "
        "(TUNEHUB_ACTIVITY_INTERVAL, default 120): how stale the culler's view can be.",
    ).tag(config=True)

    high_priority_group = Unicode(
        help="Hub group whose members may submit sweeps with priority: high "
        "(TUNEHUB_HIGH_PRIORITY_GROUP, default 'tuner-priority'). Tuner admins may too; "
        "anyone else gets 403 naming this rule. The hub creates the group; add members in "
        "the admin page or with the hub's API.",
    ).tag(config=True)

    tuner_command = List(
        Unicode(),
        help="Command that runs the tuner service (TUNEHUB_TUNER_COMMAND, split like a shell "
        "line; default: this Python with -m tuner.service).",
    ).tag(config=True)

    @default("tuner_command")
    def _tuner_command(self) -> list[str]:
        raw = os.environ.get("TUNEHUB_TUNER_COMMAND")
        return shlex.split(raw) if raw else [sys.executable, "-m", "tuner.service"]

    @default("high_priority_group")
    def _high_priority_group(self) -> str:
        return os.environ.get("TUNEHUB_HIGH_PRIORITY_GROUP") or "tuner-priority"

    @default("mode")
    def _mode(self) -> str:
        return os.environ.get("TUNEHUB_MODE") or "local"

    @default("ip")
    def _ip(self) -> str:
        return os.environ.get("TUNEHUB_IP") or "127.0.0.1"

    @default("port")
    def _port(self) -> int:
        return _env_int("TUNEHUB_PORT", 8000)

    @default("hub_port")
    def _hub_port(self) -> int:
        return _env_int("TUNEHUB_HUB_PORT", 8081)

    @default("proxy_api_port")
    def _proxy_api_port(self) -> int:
        return _env_int("TUNEHUB_PROXY_API_PORT", self.port + 1)

    @default("tuner_port")
    def _tuner_port(self) -> int:
        return _env_int("TUNEHUB_TUNER_PORT", 8082)

    @default("state_dir")
    def _state_dir(self) -> str:
        return os.environ.get("TUNEHUB_HUB_STATE") or str(self.settings.home / "hub")

    @default("db_url")
    def _db_url(self) -> str:
        return os.environ.get("TUNEHUB_HUB_DB_URL") or (
            f"sqlite:///{Path(self.state_dir) / 'jupyterhub.sqlite'}"
        )

    @default("cpu_idle_timeout")
    def _cpu_idle(self) -> int:
        return _env_int("TUNEHUB_CPU_IDLE_TIMEOUT", 7200)

    @default("gpu_idle_timeout")
    def _gpu_idle(self) -> int:
        return _env_int("TUNEHUB_GPU_IDLE_TIMEOUT", 1800)

    @default("cull_every")
    def _cull_every(self) -> int:
        return _env_int("TUNEHUB_CULL_EVERY", 0)

    @default("activity_interval")
    def _activity_interval(self) -> int:
        return _env_int("TUNEHUB_ACTIVITY_INTERVAL", 120)

    @property
    def settings(self) -> Settings:
        """The tuner's settings (TUNEHUB_HOME, TUNEHUB_DB_URL, TUNEHUB_DATA, ...)."""
        return load_settings()

    @property
    def public_url(self) -> str:
        host = "127.0.0.1" if self.ip in ("", "0.0.0.0", "::") else self.ip
        return f"http://{host}:{self.port}/"
