"""A notebook server's memory, CPU and processes bounded on one machine.

JupyterHub's ``Spawner.mem_limit`` and ``cpu_limit`` are honoured only by spawners that can
(KubeSpawner, SystemdSpawner); its local process spawner ignores them. So one person's notebook
could take the machine's memory, its CPUs, or fork until nobody can start a process (the hub
included). Here root puts each server, before it runs anything of the person's, in a bounded
group of its own: ``tunehub-people/<uid>/server-<name>``
(:func:`hub.network_fence.server_group_path`), in the v2 hierarchy where it offers the
``memory``, ``cpu`` and ``pids`` controllers (the fence's own group, then), else in each of those
controllers' v1 hierarchies (these machines: v1 controllers, a v2 hierarchy without them).
Everything the server starts is in the group too and only root moves a process out. Past its
memory the kernel kills within the group (the kernel that took too much, not the hub nor another
person's work); past its processes, a fork fails in that group only.

The group is made fresh at every start (what a previous run left is killed first) and ended
with the server (:meth:`ServerLimits.end`, also for a server that outlived a hub restart: the
group is found by the person's uid and the server's name alone). The cgroup classes are the
trials' own (:mod:`tunehub_base.cgroups`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from hub.network_fence import PEOPLE_GROUPS, server_group_path
from tunehub_base.cgroups.base import CONTROLLERS, BoundedGroup, Bounds
from tunehub_base.cgroups.mounts import MOUNTINFO, cgroup_mounts
from tunehub_base.cgroups.v1 import V1Group
from tunehub_base.cgroups.v1 import write_limits as write_v1_limits
from tunehub_base.cgroups.v2 import V2Group, enable_controllers, offers_controllers
from tunehub_base.cgroups.v2 import write_limits as write_v2_limits

#: The v2 hierarchy's key in :attr:`ServerLimits.parents`.
UNIFIED = "unified"


class LimitsUnavailable(RuntimeError):
    """The machine cannot bound a server; the message says why."""


@dataclass(frozen=True)
class ServerLimits:
    """Where people's servers get their bounded groups: ``tunehub-people`` in each hierarchy
    used (by controller on v1; :data:`UNIFIED` alone on v2)."""

    parents: dict[str, Path]

    @classmethod
    def open(cls, mountinfo: Path = MOUNTINFO) -> ServerLimits:
        """The machine's hierarchies for servers, their ``tunehub-people`` made; raises
        :class:`LimitsUnavailable` with the reasons where there is none (not root, the
        controllers not mounted)."""
        if os.geteuid() != 0:
            raise LimitsUnavailable("the hub is not root")
        mounts = cgroup_mounts(CONTROLLERS, mountinfo)
        problems = []
        for mount_root, point in mounts.get("cgroup2", []):
            offered = offers_controllers(point)
            if mount_root != "/" or not set(CONTROLLERS) <= set(offered):
                problems.append(f"cgroup v2 at {point} offers {' '.join(offered) or 'none'}")
                continue
            try:
                enable_controllers(point)
                (point / PEOPLE_GROUPS).mkdir(mode=0o755, exist_ok=True)
                enable_controllers(point / PEOPLE_GROUPS)
            except OSError as exc:
                problems.append(f"cgroup v2 at {point}: {exc.strerror or exc}")
                continue
            return cls({UNIFIED: point / PEOPLE_GROUPS})
        parents = {}
        for controller in CONTROLLERS:
            roots = [point for mount_root, point in mounts.get(controller, [])
                     if mount_root == "/"]
            if not roots:
                problems.append(f"no v1 {controller} hierarchy mounted")
                raise LimitsUnavailable("; ".join(problems))
            parents[controller] = roots[0] / PEOPLE_GROUPS
        try:
            for parent in parents.values():
                parent.mkdir(mode=0o755, exist_ok=True)
        except OSError as exc:
            raise LimitsUnavailable(f"cgroup v1: {exc.strerror or exc}") from None
        return cls(parents)

    def group(self, uid: int, server: str) -> BoundedGroup:
        """Person ``uid``'s server ``server``'s group (which may not exist)."""
        where = server_group_path(uid, server)
        if UNIFIED in self.parents:
            return V2Group([self.parents[UNIFIED] / where])
        return V1Group({c: parent / where for c, parent in self.parents.items()})

    def make(self, uid: int, server: str, bounds: Bounds) -> BoundedGroup:
        """The server's group, fresh (what its last run left killed first), with ``bounds``
        set: the caller places the server in it (:meth:`BoundedGroup.place` with 0, between
        fork and exec). OSError or :class:`LimitsUnavailable` where it cannot be."""
        if not self.end(uid, server):
            raise LimitsUnavailable(f"what {server or 'the server'} left from its last run "
                                    "would not end")
        group = self.group(uid, server)
        for parent in self.parents.values():
            person = parent / str(uid)
            person.mkdir(mode=0o755, exist_ok=True)
            if UNIFIED in self.parents:
                enable_controllers(person)
        try:
            for d in group.dirs:
                d.mkdir(mode=0o755, exist_ok=True)  # on v2, the fence may have made it
            if isinstance(group, V1Group):
                write_v1_limits(group.by_controller, bounds)
            else:
                write_v2_limits(group.dirs[0], bounds,
                                swap=(group.dirs[0] / "memory.swap.max").exists())
        except OSError:
            group.remove()
            raise
        return group

    def end(self, uid: int, server: str) -> bool:
        """Kill what is in the server's group and remove it; False if something would not
        die (the group is then left, and the next :meth:`make` tries again)."""
        group = self.group(uid, server)
        if not any(d.exists() for d in group.dirs):
            return True
        return group.close()
