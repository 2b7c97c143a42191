"""cgroup v2: an attempt's group is one directory of the unified hierarchy, with
``memory.max`` (and ``memory.swap.max`` 0 where swap is accounted: swap is no way around the
limit), ``cpu.max`` and ``pids.max``.

Killing uses ``cgroup.kill`` (Linux 5.14+): the kernel kills every process of the group at once,
including what forks meanwhile, and no pid is read and signalled later, so a pid freed and
reused in between can never be hit (the v1 way, which the base class falls back to on older
kernels). The group is empty when its ``cgroup.events`` says ``populated 0``.

v2 gives controllers only to the children of a group that enabled them
(``cgroup.subtree_control``), level by level: :func:`enable_controllers` does that for the base
and the tuner's parent (:func:`tuner.backends.local.cgroups.open_hierarchy`).
"""

from __future__ import annotations

import time
from pathlib import Path

from tunehub_base.cgroups.base import (
    CONTROLLERS,
    CPU_PERIOD_US,
    KILL_DEADLINE_SECONDS,
    BoundedGroup,
    Bounds,
    Hierarchy,
    counter,
    quota,
    read,
    write,
)


class V2Group(BoundedGroup):
    """One attempt's directory in the unified hierarchy."""

    @property
    def directory(self) -> Path:
        return self.dirs[0]

    def populated(self) -> bool:
        """Whether a process is in the group (``cgroup.events``; a gone group holds none)."""
        return counter(self.directory / "cgroup.events", "populated") > 0

    def kill(self) -> bool:
        kill_file = self.directory / "cgroup.kill"
        if not kill_file.exists():  # before Linux 5.14: pid by pid
            return super().kill()
        deadline = time.monotonic() + KILL_DEADLINE_SECONDS
        while True:
            if not self.populated() and not self.pids():
                return True
            if time.monotonic() > deadline:
                return False
            try:
                write(kill_file, 1)  # again, in case the group is not empty yet
            except FileNotFoundError:
                return True
            time.sleep(0.005)  # the kernel's exit work for what was just killed

    def oom_killed(self) -> bool:
        return counter(self.directory / "memory.events", "oom_kill") > 0


class V2Hierarchy(Hierarchy):
    """The tuner's parent in the unified hierarchy (its controllers enabled for children)."""

    version = 2

    @property
    def parent(self) -> Path:
        return self.parents[0]

    def create(self, name: str, bounds: Bounds) -> BoundedGroup:
        d = self.parent / name
        group = V2Group([d])
        try:
            d.mkdir(mode=0o755)
            write_limits(d, bounds, swap=(self.parent / "memory.swap.max").exists())
        except OSError:
            group.remove()
            raise
        return group


def write_limits(d: Path, bounds: Bounds, swap: bool) -> None:
    """``bounds`` into group ``d``'s files; ``swap``: the machine accounts swap (the parent has
    ``memory.swap.max``), so none is allowed."""
    write(d / "memory.max", "max" if bounds.memory is None else bounds.memory)
    if swap:
        write(d / "memory.swap.max", 0)
    cpu = "max" if bounds.cpu is None else quota(bounds.cpu)
    write(d / "cpu.max", f"{cpu} {CPU_PERIOD_US}")
    write(d / "pids.max", bounds.pids)


def offers_controllers(point: Path) -> list[str]:
    """The controllers the v2 hierarchy mounted at ``point`` has free for use."""
    return read(point / "cgroup.controllers").split()


def enable_controllers(d: Path) -> None:
    """Let ``d``'s children have the controllers (v2 delegates them level by level)."""
    write(d / "cgroup.subtree_control", " ".join(f"+{c}" for c in CONTROLLERS))
