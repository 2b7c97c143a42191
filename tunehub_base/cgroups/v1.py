"""cgroup v1: an attempt's group is one directory in each of the ``memory``, ``cpu`` and
``pids`` hierarchies (the machines here mount these, and a v2 hierarchy without them).

Killing is the base class's: read ``cgroup.procs``, SIGKILL each, again until empty (v1 has no
``cgroup.kill``)."""

from __future__ import annotations

from pathlib import Path

from tunehub_base.cgroups.base import (
    CPU_PERIOD_US,
    BoundedGroup,
    Bounds,
    Hierarchy,
    counter,
    quota,
    write,
)


class V1Group(BoundedGroup):
    """One attempt's directories, by controller."""

    def __init__(self, dirs: dict[str, Path]) -> None:
        super().__init__(list(dirs.values()))
        self.by_controller = dirs

    def oom_killed(self) -> bool:
        return counter(self.by_controller["memory"] / "memory.oom_control", "oom_kill") > 0


class V1Hierarchy(Hierarchy):
    """The tuner's parent in each controller's hierarchy."""

    version = 1

    def __init__(self, parents: dict[str, Path]) -> None:
        super().__init__(list(parents.values()))
        self.by_controller = parents

    def create(self, name: str, bounds: Bounds) -> BoundedGroup:
        dirs = {c: p / name for c, p in self.by_controller.items()}
        group = V1Group(dirs)
        try:
            for d in dirs.values():
                d.mkdir(mode=0o755)
            write_limits(dirs, bounds)
        except OSError:
            group.remove()
            raise
        return group


def write_limits(dirs: dict[str, Path], bounds: Bounds) -> None:
    """``bounds`` into a new group's files (``dirs``: its directory by controller)."""
    mem = dirs["memory"]
    memory = -1 if bounds.memory is None else bounds.memory
    write(mem / "memory.limit_in_bytes", memory)
    if (mem / "memory.memsw.limit_in_bytes").exists():  # swap counts: no way around
        write(mem / "memory.memsw.limit_in_bytes", memory)
    write(dirs["cpu"] / "cpu.cfs_period_us", CPU_PERIOD_US)
    write(dirs["cpu"] / "cpu.cfs_quota_us", quota(bounds.cpu))
    write(dirs["pids"] / "pids.max", bounds.pids)
