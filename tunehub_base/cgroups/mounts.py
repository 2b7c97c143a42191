"""Where this machine mounts its cgroup hierarchies, read from ``/proc/self/mountinfo``.

Two readers: the tuner's per-attempt groups (:mod:`tuner.backends.local.cgroups`, v1 or v2 by
controller) and the hub's network fence (:mod:`hub.network_fence`, which needs only the v2
hierarchy to tell whose process owns a socket)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")


def cgroup_mounts(controllers: Iterable[str], mountinfo: Path = MOUNTINFO,
                  ) -> dict[str, list[tuple[str, Path]]]:
    """Mounted cgroup hierarchies: v1 ones under each of ``controllers`` they carry, v2 ones
    under ``cgroup2``; each as (the hierarchy's path mounted there, mount point)."""
    wanted = set(controllers)
    found: dict[str, list[tuple[str, Path]]] = {}
    try:
        text = mountinfo.read_text()
    except OSError:
        return found
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        mount_root, point, fstype = fields[3], Path(fields[4]), tail[0]
        if fstype == "cgroup2":
            found.setdefault("cgroup2", []).append((mount_root, point))
        elif fstype == "cgroup":
            for option in tail[2].split(","):
                if option in wanted:
                    found.setdefault(option, []).append((mount_root, point))
    return found
