"""The hub's own settings: where it listens, where it keeps state, how long servers may idle.

Every option reads a ``TUNEHUB_*`` environment variable by default (so ``tunehub up``, a
container or a Helm chart can set it) and can also be set in a hub config file as
``c.TunehubHub.<option>``. Each option's variable, plain default and help come from the one
table of settings, :data:`tunehub_base.options.SETTINGS`; the defaults computed from other
settings are computed here.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from traitlets import Enum, Int, List, Unicode, default
from traitlets.config import Configurable

from hub import tuner_service
from tunehub_base.options import BY_OPTION, hub_state_dir, url_of
from tunehub_base.settings import Settings, load_settings


def _help(option: str) -> str:
    """The option's help text: the table's, with its variable and default."""
    s = BY_OPTION[option]
    return f"{s.help[0].upper()}{s.help[1:]} ({s.env}; default {s.default.replace('`', '')})."


class TunehubHub(Configurable):
    """Settings of the tunehub JupyterHub (both modes)."""

    mode = Enum(["local", "kubernetes"], help=_help("mode")).tag(config=True)

    ip = Unicode(help=_help("ip")).tag(config=True)

    port = Int(help=_help("port")).tag(config=True)

    hub_port = Int(help=_help("hub_port")).tag(config=True)

    proxy_api_port = Int(help=_help("proxy_api_port")).tag(config=True)

    tuner_port = Int(help=_help("tuner_port")).tag(config=True)

    state_dir = Unicode(help=_help("state_dir")).tag(config=True)

    db_url = Unicode(help=_help("db_url")).tag(config=True)

    cpu_idle_timeout = Int(help=_help("cpu_idle_timeout")).tag(config=True)

    gpu_idle_timeout = Int(help=_help("gpu_idle_timeout")).tag(config=True)

    cull_every = Int(help=_help("cull_every")).tag(config=True)

    activity_interval = Int(help=_help("activity_interval")).tag(config=True)

    high_priority_group = Unicode(help=_help("high_priority_group")).tag(config=True)

    tuner_command = List(Unicode(), help=_help("tuner_command")).tag(config=True)

    @default("tuner_command")
    def _tuner_command(self) -> list[str]:
        raw = BY_OPTION["tuner_command"].read()
        return shlex.split(raw) if raw else tuner_service.default_command()

    @default("high_priority_group")
    def _high_priority_group(self) -> str:
        return BY_OPTION["high_priority_group"].text()

    @default("mode")
    def _mode(self) -> str:
        return BY_OPTION["mode"].text()

    @default("ip")
    def _ip(self) -> str:
        return BY_OPTION["ip"].text()

    @default("port")
    def _port(self) -> int:
        return BY_OPTION["port"].number()

    @default("hub_port")
    def _hub_port(self) -> int:
        return BY_OPTION["hub_port"].number()

    @default("proxy_api_port")
    def _proxy_api_port(self) -> int:
        return BY_OPTION["proxy_api_port"].number(fallback=self.port + 1)

    @default("tuner_port")
    def _tuner_port(self) -> int:
        return BY_OPTION["tuner_port"].number()

    @default("state_dir")
    def _state_dir(self) -> str:
        return str(hub_state_dir(self.settings.home))

    @default("db_url")
    def _db_url(self) -> str:
        return BY_OPTION["db_url"].read() or (
            f"sqlite:///{Path(self.state_dir) / 'jupyterhub.sqlite'}"
        )

    @default("cpu_idle_timeout")
    def _cpu_idle(self) -> int:
        return BY_OPTION["cpu_idle_timeout"].number()

    @default("gpu_idle_timeout")
    def _gpu_idle(self) -> int:
        return BY_OPTION["gpu_idle_timeout"].number()

    @default("cull_every")
    def _cull_every(self) -> int:
        return BY_OPTION["cull_every"].number()

    @default("activity_interval")
    def _activity_interval(self) -> int:
        return BY_OPTION["activity_interval"].number()

    @property
    def settings(self) -> Settings:
        """The tuner's settings (TUNEHUB_HOME, TUNEHUB_DB_URL, TUNEHUB_DATA, ...)."""
        return load_settings()

    @property
    def public_url(self) -> str:
        return url_of(self.ip, self.port)
