"""The processes of a local attempt: how a command becomes an argv, the pid file reconcile
reads, killing a process group.

Kept apart from :mod:`tuner.backends.local`, which decides when and how to start and stop
attempts; these are the small operating-system facts it relies on.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from tunehub_base import unix_users
from tunehub_base.process_identity import ProcessIdentity
from tuner.backends._base import TrialLaunch
from tuner.backends.local.cgroups import BoundedGroup
from tuner.backends.local.log_pipes import AttemptLog

if TYPE_CHECKING:
    from tuner.backends.local.island import Island

_SHELL_CHARS = set(";&|<>$`(){}*?~\n")


def command_argv(command: str) -> list[str]:
    """Run simple commands directly (so PDEATHSIG reaches the real process); anything with
    shell syntax goes through ``sh -c``."""
    if any(ch in _SHELL_CHARS for ch in command):
        return ["/bin/sh", "-c", command]
    return shlex.split(command)


def write_pid(path: Path, pids: list[int]) -> None:
    """Root's pid file in a directory the trial's owner may write to: whatever they put at
    that name is replaced, and a link is never followed (it is only a hint for reconcile).
    Each worker's line is its identity (pid, start, boot): a pid alone is reused once the
    process ends, and reconcile must never signal whoever took it."""
    try:
        st = os.lstat(path)
        if st.st_uid != os.geteuid() or not stat.S_ISREG(st.st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
    except OSError:
        return
    with open(fd, "w") as fh:
        fh.write("\n".join(_identity(pid).line() for pid in pids))  # the chief first


def _identity(pid: int) -> ProcessIdentity:
    """A worker's identity; just its pid where it already ended (nothing left to find)."""
    try:
        return ProcessIdentity.of(pid)
    except ProcessLookupError:
        return ProcessIdentity(pid)


def still_running(record: ProcessIdentity, marker: bytes) -> bool:
    """The recorded worker runs still: by its start time, or, in a pid file of an earlier
    version (no start time), by ``marker`` in its environment (root reads ``/proc``, not a
    path the trial controls)."""
    verdict = record.alive()
    if verdict is not None:
        return verdict
    try:
        return marker in Path(f"/proc/{record.pid}/environ").read_bytes()
    except OSError:
        return False


class Attempt:
    """The processes of one attempt: one per worker, worker 0 (the chief) first."""

    def __init__(
        self, launch: TrialLaunch, procs: list[tuple[int, asyncio.Future[int]]], gpus: list[str],
        log: AttemptLog, owner: unix_users.UnixUser | None = None,
        group: BoundedGroup | None = None, island: Island | None = None,
    ) -> None:
        self.launch = launch
        self.procs = procs  # (pid = process group, future of the exit code: <0 for a signal)
        self.gpus = gpus
        self.log = log  # the workers' output pipes and the trial's log
        self.owner = owner
        self.group = group  # its cgroup; None where the machine offers none
        self.island = island  # its network namespace, closed when it ends
        self.stop_reason: str | None = None

    @property
    def pid(self) -> int:
        return self.procs[0][0]

    @property
    def done(self) -> asyncio.Future[int]:
        return self.procs[0][1]


def killpg(pgid: int, sig: int) -> None:
    """Signal an attempt's process group; quietly nothing if it is already gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        try:  # a warm trial just forked, not yet the leader of its own group
            os.kill(pgid, sig)
        except ProcessLookupError:
            pass
