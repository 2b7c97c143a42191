"""``TUNEHUB_POOL_SHARES``: the pool's weights and caps, inline or in a file an admin edits.

The value is either the configuration itself (JSON or YAML, starting with ``{``) or the path
of a YAML/JSON file holding it (the dict :class:`~tunehub_base.pool.shares.ShareConfig` reads)::

    people:
      ana: {weight: 2, max_gpus: 4}
    groups:
      vision: {weight: 3, max_gpus: 8}

A file is read again when it changes (its size or modification time), so an admin changes a
cap without restarting the tuner, and a cap lowered below what someone holds stops new starts
(nobody running is stopped for it). A value that cannot be read or parsed keeps the last good
configuration (the defaults at first) and the error is kept for the pool's view and logged
once: a typo in an admin's file must neither stop the tuner nor silently drop everyone's caps
without a word. The setting is the operator's, like every ``TUNEHUB_*`` variable: the path is
theirs, not a person's.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import yaml

from tunehub_base.options import setting
from tunehub_base.pool.shares import ShareConfig

ENV = "TUNEHUB_POOL_SHARES"
#: Larger files are refused: a share table is a few lines per person.
MAX_BYTES = 1 << 20

log = logging.getLogger("tunehub.pool")


def parse_shares(text: str, where: str = ENV) -> ShareConfig:
    """A configuration from JSON or YAML text; a ValueError saying where and what is wrong."""
    try:
        data: Any = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError as exc:
        try:  # YAML 1.1 rejects a few JSON forms; the JSON error is the clearer one then
            data = json.loads(text)
        except ValueError:
            raise ValueError(f"{where}: not JSON or YAML ({str(exc).splitlines()[0]})") from None
    try:
        return ShareConfig.from_dict(data)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


class SharesSource:
    """The configuration in force, from the setting; :meth:`current` re-reads a changed file."""

    def __init__(self, value: str | None = None) -> None:
        """``value``: the setting's text (default: ``TUNEHUB_POOL_SHARES`` from the environment;
        unset or empty: everyone weight 1, no cap)."""
        raw = setting(ENV).read() if value is None else (value or None)
        self.value = raw
        self.path: Path | None = None
        self.error: str | None = None
        self._config = ShareConfig()
        self._stamp: tuple[int, int, int] | None = None
        if raw is None:
            return
        if raw.lstrip().startswith("{"):
            self._apply(lambda: parse_shares(raw))
        else:
            self.path = Path(raw).expanduser()
            self.current()

    def current(self) -> ShareConfig:
        """The configuration now (a file is read again only when it changed)."""
        if self.path is None:
            return self._config
        try:
            st = os.stat(self.path)
            stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
        except OSError as exc:
            stamp = None
            if self._stamp != (-1, -1, -1):
                self._stamp = (-1, -1, -1)
                self._fail(f"{ENV}: cannot read {self.path} ({exc.strerror or exc})")
            return self._config
        if stamp != self._stamp:
            self._stamp = stamp
            self._apply(self._read_file)
        return self._config

    def _read_file(self) -> ShareConfig:
        assert self.path is not None
        try:
            with open(self.path, "rb") as fh:
                data = fh.read(MAX_BYTES + 1)
        except OSError as exc:
            raise ValueError(f"{ENV}: cannot read {self.path} ({exc.strerror or exc})") from None
        if len(data) > MAX_BYTES:
            raise ValueError(f"{ENV}: {self.path} is larger than {MAX_BYTES} bytes")
        return parse_shares(data.decode("utf-8", "replace"), f"{ENV} ({self.path})")

    def _apply(self, read: Any) -> None:
        try:
            self._config = read()
        except ValueError as exc:
            self._fail(str(exc))
            return
        if self.error is not None:
            log.info("%s: read again, in force now", ENV)
        self.error = None

    def _fail(self, message: str) -> None:
        self.error = f"{message}; the previous shares stay in force"
        log.error("%s", self.error)
