"""Why a person's GPU server was reclaimed, kept where a restarted hub finds it.

Why a file in the hub's state directory: the reason is read on the person's next visit to the
hub's home page, which may come after a hub restart (an upgrade, a crash); the state directory
is the hub's own (0700, like its cookie secret and, by default, its database) and no person can
write there. It is one small JSON object ``{person: {"reason", "at"}}``, written whole under a
temporary name and renamed into place, every open relative to the directory opened once with
``O_NOFOLLOW``: a link planted there is never followed, a half-written file is never read.

An entry lasts until the person's server runs again (:meth:`StopReasons.forget`); at most
:data:`MAX_ENTRIES` are kept, the oldest dropped first.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("JupyterHub")

FILE = "gpu-reclaim-reasons.json"
MAX_ENTRIES = 10_000
MAX_BYTES = 16 * 1024 * 1024
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class Stopped:
    """Why a person's server was stopped, for the home page."""

    reason: str
    at: float


class StopReasons:
    """The reasons, in memory and (given a directory) in :data:`FILE` there."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = Path(directory) if directory else None
        self._lock = threading.Lock()
        self._entries: dict[str, Stopped] | None = None  # read on first use

    def get(self, person: str) -> Stopped | None:
        return self._loaded().get(person)

    def keep(self, person: str, reason: str, at: float) -> None:
        with self._lock:
            entries = self._loaded()
            entries.pop(person, None)
            entries[person] = Stopped(reason, at)
            while len(entries) > MAX_ENTRIES:
                entries.pop(min(entries, key=lambda p: entries[p].at))
            self._save(entries)

    def forget(self, person: str) -> None:
        """The person's server runs again: the reason is past."""
        if person not in self._loaded():
            return
        with self._lock:
            entries = self._loaded()
            if entries.pop(person, None) is not None:
                self._save(entries)

    def _loaded(self) -> dict[str, Stopped]:
        if self._entries is None:
            self._entries = self._read()
        return self._entries

    def _read(self) -> dict[str, Stopped]:
        """The file's entries; none when it is missing, damaged or not a plain file (a link:
        ``ELOOP``), so the home page never fails on it."""
        if self.directory is None:
            return {}
        try:
            dir_fd = os.open(self.directory, _DIR)
        except OSError:
            return {}
        try:
            fd = os.open(FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=dir_fd)
        except OSError as exc:
            if not isinstance(exc, FileNotFoundError):
                log.warning("GPU reclaim reasons not read from %s: %s", self.directory, exc)
            return {}
        finally:
            os.close(dir_fd)
        with os.fdopen(fd, "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
        try:
            data: Any = json.loads(raw) if len(raw) <= MAX_BYTES else {}
        except ValueError:
            data = {}  # not ours to fix: the next reason written replaces it
        entries: dict[str, Stopped] = {}
        for person, item in (data.items() if isinstance(data, dict) else ()):
            if isinstance(item, dict) and isinstance(item.get("reason"), str) \
                    and isinstance(item.get("at"), (int, float)):
                entries[str(person)] = Stopped(item["reason"], float(item["at"]))
        return entries

    def _save(self, entries: dict[str, Stopped]) -> None:
        if self.directory is None:
            return
        body = json.dumps({p: s.__dict__ for p, s in entries.items()}).encode()
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        dir_fd = os.open(self.directory, _DIR)
        temp = f".{FILE}.{secrets.token_hex(4)}"
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
            with os.fdopen(fd, "wb") as fh:
                fh.write(body)
                fh.flush()
                os.fsync(fh.fileno())
            os.rename(temp, FILE, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp, dir_fd=dir_fd)
            os.close(dir_fd)
