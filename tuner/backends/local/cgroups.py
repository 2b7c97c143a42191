"""One cgroup per local attempt: its memory, CPU and processes bounded, and all of it killed at
its end.

A process group is not a boundary: a trial's ``setsid sleep 1000 &`` or a double fork leaves
it, and ``killpg`` never reaches what did. A cgroup is: every process the attempt's workers
start is in it (the kernel puts children in their parent's group and only root moves them
out), so at the attempt's end :meth:`AttemptGroup.kill` kills every pid it lists, again until
none is left (or writes ``cgroup.kill`` on v2), and the group is removed. The limits come from
the trial's ``resources`` for the whole attempt (``memory`` and ``cpu`` × ``workers``, the
same totals as the attempt's pods on Kubernetes) plus a process cap
(``TUNEHUB_ATTEMPT_PIDS`` × ``workers``): a trial past its memory is killed by the kernel and
its attempt fails saying so (:meth:`AttemptGroup.oom_killed`).

Where: cgroup v2 when a v2 hierarchy offers the ``memory``, ``cpu`` and ``pids``
controllers, else the v1 hierarchies of those controllers. The tuner makes a parent of its
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

import abc
import errno
import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from tunehub_base.options import setting
from tunehub_base.process_identity import ProcessIdentity

CONTROLLERS = ("memory", "cpu", "pids")
CPU_PERIOD_US = 100_000
MIN_CPU_QUOTA_US = 1_000  # the kernel's floor for cfs_quota_us
KILL_DEADLINE_SECONDS = 10.0  # a group that will not empty in this long is left, and logged
ATTEMPT_PIDS = setting("TUNEHUB_ATTEMPT_PIDS")


@dataclass(frozen=True)
class Bounds:
    """What one attempt may use, all its workers together."""

    memory: int  # bytes
    cpu: float  # cores
    pids: int  # processes and threads


class AttemptGroup(abc.ABC):
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
            _rmdir(d)

    def close(self) -> bool:
        """Kill everything in the group, then remove it; False if something would not die."""
        emptied = self.kill()
        if emptied:
            self.remove()
        return emptied

    @abc.abstractmethod
    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of the group for exceeding its memory."""


class _V1Group(AttemptGroup):
    def __init__(self, dirs: dict[str, Path]) -> None:
        super().__init__(list(dirs.values()))
        self.by_controller = dirs

    def oom_killed(self) -> bool:
        return _counter(self.by_controller["memory"] / "memory.oom_control", "oom_kill") > 0


class _V2Group(AttemptGroup):
    def kill(self) -> bool:
        try:
            (self.dirs[0] / "cgroup.kill").write_text("1")
        except OSError:
            pass  # before Linux 5.14: pid by pid
        return super().kill()

    def oom_killed(self) -> bool:
        return _counter(self.dirs[0] / "memory.events", "oom_kill") > 0


class Hierarchy(abc.ABC):
    """Where attempt groups are made: the tuner's parent group in each hierarchy."""

    version: int

    def __init__(self, parents: list[Path]) -> None:
        self.parents = parents

    @abc.abstractmethod
    def create(self, name: str, bounds: Bounds) -> AttemptGroup:
        """A new group ``name`` under the parent with ``bounds`` set (OSError if it cannot)."""

    def close(self) -> None:
        """Remove the parent (the backend kills and removes its groups first)."""
        for parent in self.parents:
            _rmdir(parent)


class _V1(Hierarchy):
    version = 1

    def __init__(self, parents: dict[str, Path]) -> None:
        super().__init__(list(parents.values()))
        self.by_controller = parents

    def create(self, name: str, bounds: Bounds) -> AttemptGroup:
        dirs = {c: p / name for c, p in self.by_controller.items()}
        group = _V1Group(dirs)
        try:
            for d in dirs.values():
                d.mkdir(mode=0o755)
            mem = dirs["memory"]
            _write(mem / "memory.limit_in_bytes", bounds.memory)
            if (mem / "memory.memsw.limit_in_bytes").exists():  # swap counts: no way around
                _write(mem / "memory.memsw.limit_in_bytes", bounds.memory)
            _write(dirs["cpu"] / "cpu.cfs_period_us", CPU_PERIOD_US)
            _write(dirs["cpu"] / "cpu.cfs_quota_us", _quota(bounds.cpu))
            _write(dirs["pids"] / "pids.max", bounds.pids)
        except OSError:
            group.remove()
            raise
        return group


class _V2(Hierarchy):
    version = 2

    def create(self, name: str, bounds: Bounds) -> AttemptGroup:
        d = self.parents[0] / name
        group = _V2Group([d])
        try:
            d.mkdir(mode=0o755)
            _write(d / "memory.max", bounds.memory)
            if (d / "memory.swap.max").exists():
                _write(d / "memory.swap.max", 0)
            (d / "cpu.max").write_text(f"{_quota(bounds.cpu)} {CPU_PERIOD_US}")
            _write(d / "pids.max", bounds.pids)
        except OSError:
            group.remove()
            raise
        return group


def open_hierarchy() -> tuple[Hierarchy | None, str]:
    """The hierarchy attempts get their groups in, and a line for the log saying which (or,
    with None, why there is none)."""
    mounts = _cgroup_mounts()
    own = _own_cgroups()
    name = f"tunehub-{_owner_part()}-{secrets.token_hex(4)}"
    problems: list[str] = []
    for mount_root, point in mounts.get("cgroup2", []):
        available = _read(point / "cgroup.controllers").split()
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
                _enable_v2(base)
                parent.mkdir(mode=0o755)
                _enable_v2(parent)
            except OSError as exc:
                _rmdir(parent)
                problems.append(f"cgroup v2 at {base}: {exc.strerror or exc}")
                continue
            return _V2([parent]), f"cgroup v2 at {parent}"
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
            _rmdir(parent)
        problems.append(f"cgroup v1: {exc.strerror or exc}")
        return None, "; ".join(problems)
    return _V1(parents), "cgroup v1 at " + ", ".join(str(p) for p in parents.values())


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
            _V1Group({"any": group}).close()
        _rmdir(parent)


def _cgroup_mounts() -> dict[str, list[tuple[str, Path]]]:
    """Mounted cgroup hierarchies from ``/proc/self/mountinfo``: for v1 by controller, for v2
    under ``cgroup2``; each as (the hierarchy's path mounted there, mount point)."""
    found: dict[str, list[tuple[str, Path]]] = {}
    for line in _read(Path("/proc/self/mountinfo")).splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        mount_root, point, fstype = fields[3], Path(fields[4]), tail[0]
        if fstype == "cgroup2":
            found.setdefault("cgroup2", []).append((mount_root, point))
        elif fstype == "cgroup":
            for option in tail[2].split(","):
                if option in CONTROLLERS:
                    found.setdefault(option, []).append((mount_root, point))
    return found


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup path per v1 controller, and under ``""`` on v2."""
    own: dict[str, str] = {}
    for line in _read(Path("/proc/self/cgroup")).splitlines():
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


def _enable_v2(d: Path) -> None:
    """Let ``d``'s children have the controllers (v2 delegates them level by level)."""
    (d / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in CONTROLLERS))


def _quota(cpu: float) -> int:
    return max(MIN_CPU_QUOTA_US, int(cpu * CPU_PERIOD_US))


def _write(path: Path, value: int) -> None:
    path.write_text(str(value))


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _counter(path: Path, key: str) -> int:
    """A ``key value`` line's value in a cgroup's statistics file (0 when absent)."""
    for line in _read(path).splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def _rmdir(d: Path) -> None:
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
