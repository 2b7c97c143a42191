"""One cgroup per local attempt: its memory, CPU and processes bounded, and all of it killed at
its end.

A process group is not a boundary: a trial's ``setsid sleep 1000 &`` or a double fork leaves
it, and ``killpg`` never reaches what did. A cgroup is: every process the attempt's workers
start is in it (the kernel puts children in their parent's group and only root moves them
out), so at the attempt's end :meth:`BoundedGroup.kill` kills every pid it lists, again until
none is left (or writes ``cgroup.kill`` on v2), and the group is removed. The limits come from
the trial's ``resources`` for the whole attempt (``memory`` and ``cpu`` × ``workers``, the
same totals as the attempt's pods on Kubernetes) plus a process cap
(``TUNEHUB_ATTEMPT_PIDS`` × ``workers``): a trial past its memory is killed by the kernel and
its attempt fails saying so (:meth:`BoundedGroup.oom_killed`).

Where: cgroup v2 when a v2 hierarchy offers the ``memory``, ``cpu`` and ``pids``
controllers, else the v1 hierarchies of those controllers (:func:`open_hierarchy`, the one
place that chooses; each version is one module behind the same base classes:
:mod:`~tunehub_base.cgroups.v1`, :mod:`~tunehub_base.cgroups.v2`,
:mod:`~tunehub_base.cgroups.base`). The tuner makes a parent of its
own, ``tunehub-<pid>-<start>-<random>``, below its own cgroup in each hierarchy (so whatever
bounds the tuner bounds its trials too; on v2, whose controllers reach only the children of a group
without processes, below the hierarchy's root when its own group has them), one group per
attempt in it, and removes the parent when the backend closes. The groups are made by root
and stay root's: a process is placed in its group by root before it runs any of the trial's
code (a cold start between fork and exec, before privileges are dropped; a warm start by the
backend while the forked child waits, see :mod:`tuner.backends.local.zygote`), and a trial can
neither leave its group nor change its limits. :func:`open_hierarchy` returns None, with the
reason, where no hierarchy is usable (not root, nothing mounted); the backend then says so
once in its log and keeps killing process groups.
"""

from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path

from tunehub_base.cgroups.base import (
    CONTROLLERS,
    BoundedGroup,
    Bounds,
    Hierarchy,
    read,
    rmdir,
)
from tunehub_base.cgroups.mounts import MOUNTINFO, cgroup_mounts
from tunehub_base.cgroups.v1 import V1Group, V1Hierarchy
from tunehub_base.cgroups.v2 import V2Hierarchy, enable_controllers, offers_controllers
from tunehub_base.options import setting
from tunehub_base.process_identity import ProcessIdentity

__all__ = ["BoundedGroup", "Bounds", "Hierarchy", "bounds_for", "open_hierarchy"]

ATTEMPT_PIDS = setting("TUNEHUB_ATTEMPT_PIDS")
OWN_CGROUPS = Path("/proc/self/cgroup")


def open_hierarchy(mountinfo: Path = MOUNTINFO, own_cgroups: Path = OWN_CGROUPS,
                   ) -> tuple[Hierarchy | None, str]:
    """The hierarchy attempts get their groups in, and a line for the log saying which (or,
    with None, why there is none). The rule: v2 where a v2 hierarchy offers every one of
    :data:`CONTROLLERS` and its groups can be made, else v1. (``mountinfo`` and
    ``own_cgroups`` are this process's; a test gives stand-ins describing another machine.)"""
    mounts = _cgroup_mounts(mountinfo)
    own = _own_cgroups(own_cgroups)
    name = f"tunehub-{_owner_part()}-{secrets.token_hex(4)}"
    problems: list[str] = []
    for mount_root, point in mounts.get("cgroup2", []):
        available = offers_controllers(point)
        if not set(CONTROLLERS) <= set(available):
            problems.append(f"cgroup v2 at {point} offers {' '.join(available) or 'none'} of "
                            f"{', '.join(CONTROLLERS)}")
            continue
        # Below our own group; where it holds processes (v2 gives controllers to the children
        # of a group without any, the root aside), below the root of the hierarchy.
        for base in dict.fromkeys([point / _below(own.get("", "/"), mount_root), point]):
            _clear_stale(base)
            parent = base / name
            try:
                enable_controllers(base)
                parent.mkdir(mode=0o755)
                enable_controllers(parent)
            except OSError as exc:
                rmdir(parent)
                problems.append(f"cgroup v2 at {base}: {exc.strerror or exc}")
                continue
            return V2Hierarchy([parent]), f"cgroup v2 at {parent}"
    parents: dict[str, Path] = {}
    try:
        for controller in CONTROLLERS:
            where = [(r, p) for r, p in mounts.get(controller, [])]
            if not where:
                raise FileNotFoundError(errno.ENOENT, f"no v1 {controller} hierarchy mounted")
            mount_root, point = where[0]
            base = point / _below(own.get(controller, "/"), mount_root)
            _clear_stale(base)
            parent = base / name
            parent.mkdir(mode=0o755)
            parents[controller] = parent
    except OSError as exc:
        for parent in parents.values():
            rmdir(parent)
        problems.append(f"cgroup v1: {exc.strerror or exc}")
        return None, "; ".join(problems)
    return V1Hierarchy(parents), "cgroup v1 at " + ", ".join(str(p) for p in parents.values())


def bounds_for(memory: int, cpu: float, workers: int) -> Bounds:
    """An attempt's bounds from its trial's ``resources`` (per worker) and the process cap."""
    return Bounds(memory=memory * workers, cpu=cpu * workers,
                  pids=ATTEMPT_PIDS.number() * workers)


def _owner_part() -> str:
    """This tuner in its parent groups' names: ``PID-START`` (``/proc/PID/stat`` field 22), so
    a later tuner never mistakes a process that took a dead one's pid for it."""
    me = ProcessIdentity.current()
    return f"{me.pid}-{me.start}" if me.start is not None else str(me.pid)


def _owner(name: str) -> ProcessIdentity | None:
    """The tuner a parent group is named after: ``tunehub-PID-START-RANDOM``, or
    ``tunehub-PID-RANDOM`` (an earlier version, or no start time to read); None for any other
    name."""
    parts = name.split("-")
    try:
        if len(parts) == 4:
            return ProcessIdentity(int(parts[1]), int(parts[2]))
        if len(parts) == 3:
            return ProcessIdentity(int(parts[1]))
    except ValueError:
        pass
    return None


def _clear_stale(base: Path) -> None:
    """Kill and remove what a tuner that died without closing its backend left below
    ``base`` (its parent is named by its identity): a crash must not leave trials running
    unbounded by anything that will ever end them."""
    for parent in base.glob("tunehub-*-*"):
        owner = _owner(parent.name)
        if owner is None:
            continue
        alive = owner.alive()
        if alive is None:  # no start time in the name: by the pid (a reused one keeps it)
            try:
                os.kill(owner.pid, 0)
            except ProcessLookupError:
                alive = False
            except PermissionError:
                pass
        if alive is not False:
            continue
        for group in [d for d in parent.iterdir() if d.is_dir()]:
            V1Group({"any": group}).close()  # pid by pid: right for either version
        rmdir(parent)


def _cgroup_mounts(mountinfo: Path = MOUNTINFO) -> dict[str, list[tuple[str, Path]]]:
    """The hierarchies of :data:`CONTROLLERS` (v1) and the v2 one, where mounted."""
    return cgroup_mounts(CONTROLLERS, mountinfo)


def _own_cgroups(own_cgroups: Path = OWN_CGROUPS) -> dict[str, str]:
    """This process's cgroup path per v1 controller, and under ``""`` on v2."""
    own: dict[str, str] = {}
    for line in read(own_cgroups).splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = path
    return own


def _below(path: str, mount_root: str) -> str:
    """``path`` (a cgroup path) relative to the part of the hierarchy mounted (a container
    sees its own cgroup as its mount's root)."""
    if mount_root != "/" and path.startswith(mount_root):
        path = path[len(mount_root):]
    return path.lstrip("/")
