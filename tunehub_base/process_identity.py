"""Which process a recorded pid meant: the pid, its start time and the machine's boot.

A pid alone names a process only until it ends: the kernel hands the number out again (here
``pid_max`` is 32768 and a busy machine wraps it within minutes), so "is pid N alive" can answer
for a stranger, keeping a dead sweep from ever resuming, or signalling an innocent process. A
process is therefore recorded as ``(pid, start, boot)``: ``start`` is field 22 of
``/proc/PID/stat`` (clock ticks after boot; no two processes with the same pid share it), and
``boot`` is ``/proc/sys/kernel/random/boot_id`` (a reboot starts the tick count again). The
process is alive when a process with that pid runs now, started at that tick, in this boot.

A record without a start time (written by an earlier version) cannot be judged by this rule;
:meth:`ProcessIdentity.alive` says so with ``None`` and the caller decides by other evidence
(a controller's heartbeat).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
#: Process states in ``/proc/PID/stat`` of a process that has ended (a zombie waits to be reaped).
_ENDED = frozenset({"Z", "X", "x"})


@functools.cache
def boot_id() -> str | None:
    """This boot of the machine; None where the kernel does not tell."""
    try:
        return BOOT_ID.read_text().strip() or None
    except OSError:
        return None


def _stat(pid: int) -> tuple[str, int]:
    """The process's state letter and start time (field 22) from ``/proc/PID/stat``. The name
    (field 2) may hold spaces and parentheses, so the fields are counted after its last ``)``."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[19])


@dataclass(frozen=True)
class ProcessIdentity:
    """One process, as recorded: ``start`` and ``boot`` are None in a record that lacks them."""

    pid: int
    start: int | None = None
    boot: str | None = None

    @classmethod
    def of(cls, pid: int) -> ProcessIdentity:
        """The identity of the process ``pid`` runs now; ``ProcessLookupError`` when none does
        (or only a zombie), ``start`` None when its ``/proc`` entry cannot be read."""
        try:
            state, start = _stat(pid)
        except FileNotFoundError:
            raise ProcessLookupError(pid) from None
        except (OSError, ValueError, IndexError):
            return cls(pid)
        if state in _ENDED:
            raise ProcessLookupError(pid)
        return cls(pid, start, boot_id())

    @classmethod
    def current(cls) -> ProcessIdentity:
        """This process."""
        return cls.of(os.getpid())

    def alive(self) -> bool | None:
        """Is the recorded process still running? None when that cannot be told: the record
        has no start time, or ``/proc`` hides the process (``hidepid``) though it exists."""
        if self.start is None:
            return None
        if self.boot is not None and boot_id() is not None and self.boot != boot_id():
            return False  # the machine rebooted since: every process of that boot is gone
        try:
            now = ProcessIdentity.of(self.pid)
        except ProcessLookupError:
            return _hidden(self.pid)
        if now.start is None:
            return None
        return now.start == self.start

    def started_at(self) -> float | None:
        """When the process started, in seconds since the epoch (to about a second: the boot
        time is whole seconds); None without a start time. For records others wrote with a
        bare pid (a pid file of JupyterHub's): a process that started after the file was
        written is not the one it names."""
        if self.start is None:
            return None
        try:
            btime = next(int(line.split()[1]) for line in
                         Path("/proc/stat").read_text().splitlines() if line.startswith("btime "))
        except (OSError, StopIteration, ValueError, IndexError):
            return None
        return btime + self.start / os.sysconf("SC_CLK_TCK")

    # --- how a record is written and read back ---------------------------------------------

    @property
    def token(self) -> str | None:
        """The part of the identity beside the pid, as one string (``START@BOOT``): what the
        database stores next to the pid; None when there is no start time."""
        if self.start is None:
            return None
        return f"{self.start}@{self.boot or ''}"

    @classmethod
    def from_token(cls, pid: int, token: str | None) -> ProcessIdentity:
        """The identity stored as ``pid`` and :attr:`token`; a missing or unreadable token
        gives a record without a start time."""
        if not token:
            return cls(pid)
        start, _, boot = token.partition("@")
        try:
            return cls(pid, int(start), boot or None)
        except ValueError:
            return cls(pid)

    def line(self) -> str:
        """One line of a pid file: ``PID START BOOT`` (the pid first, so a reader that wants
        only the pid takes the first word)."""
        return " ".join(str(part) for part in (self.pid, self.start, self.boot)
                        if part is not None)

    @classmethod
    def parse(cls, line: str) -> ProcessIdentity:
        """A line written by :meth:`line`, or a bare pid (an earlier version's pid file);
        ``ValueError`` when it is neither."""
        words = line.split()
        if not words or len(words) > 3:
            raise ValueError(f"not a process record: {line!r}")
        pid = int(words[0])
        start = int(words[1]) if len(words) > 1 else None
        return cls(pid, start, words[2] if len(words) > 2 else None)


def parse_records(text: str) -> list[ProcessIdentity]:
    """Every process of a pid file (one a line; blank lines skipped)."""
    return [ProcessIdentity.parse(line) for line in text.splitlines() if line.strip()]


def _hidden(pid: int) -> bool | None:
    """``/proc`` showed no live process ``pid``: gone (False), unless the kernel still knows a
    process ``/proc`` hides (``hidepid``, another pid namespace), then None."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return None
    try:
        _stat(pid)
    except (OSError, ValueError, IndexError):
        return None
    return False  # visible now: a zombie, or a process that took the pid since
