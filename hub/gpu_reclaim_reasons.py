"""Why a person's GPU server was reclaimed, kept where a restarted hub finds it.

Why a file in the hub's state directory: the reason is read on the person's next visit to the
hub's home page, which may come after a hub restart (an upgrade, a crash); the state directory
is the hub's own (0700, like its cookie secret and, by default, its database) and no person can
write there. It is one small JSON object ``{person: {"reason", "at"}}``, read and replaced with
:mod:`tunehub_base.private_json` (0600, written whole and renamed into place, never through a
link; a damaged file reads as no reasons).

An entry lasts until the person's server runs again (:meth:`StopReasons.forget`); at most
:data:`MAX_ENTRIES` are kept, the oldest dropped first.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from tunehub_base.private_json import read_json, write_json

FILE = "gpu-reclaim-reasons.json"
MAX_ENTRIES = 10_000


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
        data = read_json(self.directory, FILE) if self.directory else None
        entries: dict[str, Stopped] = {}
        for person, item in (data.items() if isinstance(data, dict) else ()):
            if isinstance(item, dict) and isinstance(item.get("reason"), str) \
                    and isinstance(item.get("at"), (int, float)):
                entries[str(person)] = Stopped(item["reason"], float(item["at"]))
        return entries

    def _save(self, entries: dict[str, Stopped]) -> None:
        if self.directory is not None:
            write_json(self.directory, FILE, {p: s.__dict__ for p, s in entries.items()})
