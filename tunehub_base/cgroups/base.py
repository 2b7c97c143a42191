"""What every cgroup version gives: :class:`BoundedGroup` (one attempt's or notebook server's
group) and :class:`Hierarchy` (the tuner's parent, where attempts' groups are made), and the
file helpers both use.

Why a base class: which cgroup version a machine offers is the machine's choice (v2 where a v2
hierarchy has the ``memory``, ``cpu`` and ``pids`` controllers, else v1,
:func:`tuner.backends.local.cgroups.open_hierarchy`, :meth:`hub.server_limits.ServerLimits.open`),
and the backend and the hub must not care. Each
version is one module (:mod:`~tunehub_base.cgroups.v1`,
:mod:`~tunehub_base.cgroups.v2`) implementing these two classes.
"""

from __future__ import annotations

import abc
import errno
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

CONTROLLERS = ("memory", "cpu", "pids")
CPU_PERIOD_US = 100_000
MIN_CPU_QUOTA_US = 1_000  # the kernel's floor for cfs_quota_us
KILL_DEADLINE_SECONDS = 10.0  # a group that will not empty in this long is left, and logged


@dataclass(frozen=True)
class Bounds:
    """What one attempt may use, all its workers together."""

    memory: int | None  # bytes; None: no limit
    cpu: float | None  # cores; None: no limit
    pids: int  # processes and threads


class BoundedGroup(abc.ABC):
    """The cgroup(s) of one attempt: one directory per hierarchy (one on v2, one per
    controller on v1), each made by root and bounded by :class:`Bounds`."""

    def __init__(self, dirs: list[Path]) -> None:
        self.dirs = dirs

    def place(self, pid: int) -> None:
        """Move ``pid`` (0: the calling process) into the group, in every hierarchy. Raises
        OSError if it cannot: the caller must then not let that process run the trial."""
        data = str(pid).encode()
        for d in self.dirs:
            fd = os.open(d / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)

    def pids(self) -> set[int]:
        """Every process in the group now."""
        found: set[int] = set()
        for d in self.dirs:
            try:
                text = (d / "cgroup.procs").read_text()
            except FileNotFoundError:
                continue
            found.update(int(p) for p in text.split())
        return found

    def kill(self) -> bool:
        """SIGKILL every process in the group, again and again until none is left (what
        forks meanwhile is in the group too); True once it is empty."""
        deadline = time.monotonic() + KILL_DEADLINE_SECONDS
        while True:
            alive = self.pids()
            if not alive:
                return True
            if time.monotonic() > deadline:
                return False
            for pid in alive:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.005)  # the kernel's exit work for what was just killed, then again

    def remove(self) -> None:
        """Remove the (empty) group; a group the kernel still counts busy is retried briefly
        (killed processes leave it as their exit completes)."""
        for d in self.dirs:
            rmdir(d)

    def close(self) -> bool:
        """Kill everything in the group, then remove it; False if something would not die."""
        emptied = self.kill()
        if emptied:
            self.remove()
        return emptied

    @abc.abstractmethod
    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of the group for exceeding its memory."""


class Hierarchy(abc.ABC):
    """Where attempt groups are made: the tuner's parent group in each hierarchy."""

    version: int

    def __init__(self, parents: list[Path]) -> None:
        self.parents = parents

    @abc.abstractmethod
    def create(self, name: str, bounds: Bounds) -> BoundedGroup:
        """A new group ``name`` under the parent with ``bounds`` set (OSError if it cannot)."""

    def close(self) -> None:
        """Remove the parent (the backend kills and removes its groups first)."""
        for parent in self.parents:
            rmdir(parent)


def quota(cpu: float | None) -> int:
    """CPU cores as a CFS quota (µs per :data:`CPU_PERIOD_US`); -1 for no limit."""
    return -1 if cpu is None else max(MIN_CPU_QUOTA_US, int(cpu * CPU_PERIOD_US))


def write(path: Path, value: int | str) -> None:
    path.write_text(str(value))


def read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def counter(path: Path, key: str) -> int:
    """A ``key value`` line's value in a cgroup's statistics file (0 when absent)."""
    for line in read(path).splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def rmdir(d: Path) -> None:
    """Remove a cgroup directory, retrying briefly while the kernel still counts it busy."""
    deadline = time.monotonic() + 2.0
    while True:
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                return
            time.sleep(0.01)  # the last killed processes are still leaving the group
