"""Each person's notebook processes are a network island of their own on one machine.

Trials already are (:mod:`tuner.backends.local.island`); a notebook server cannot be, since the
proxy must reach it and it must reach the hub, the tuner and the data store. But a person also
starts listeners from notebooks: a debug server, TensorBoard, a Dask scheduler, a TensorFlow
gRPC server (the attack that opened issue 31, run from a cell instead of a trial). Any of them
took connections from every account of the machine. Now a listener of a person's notebook
processes takes new connections only from that person's processes and from the platform's own
(root: the hub, the proxy, the tuner); another person, any other Unix user, a trial's island and
the network get a refusal, on every address and port, TCP or UDP, IPv4 or IPv6.

How, by construction rather than per port:

- Before a notebook server runs anything of the person's, it is placed (by root, between fork
  and exec) in a group of its own inside the person's group of the cgroup v2 hierarchy,
  ``tunehub-people/<uid>/server-<name>`` (membership only, no controller: it bounds nothing).
  The kernel puts everything the server starts (kernels, terminals, what a cell starts, double
  forks) in the same group, and only root can move a process out. Every socket remembers the
  group of the process that made it. (The same group lets the hub end everything a server
  started when it stops, :func:`end_group`: a ``nohup`` job left behind would go on using the
  GPUs the server gave back.)
- One nftables table, ``inet tunehub_people``. Its output chain marks every new connection to
  one of the machine's own addresses with who opened it (a conntrack mark: root, or a person's
  uid; nothing for anyone else). Its input chain refuses a new connection whose receiving
  socket belongs to a person's group unless root or that person opened it. Only new
  connections are judged, so answers to what the person opened pass.

The table is derived from the directory of groups alone (one rule per group, whose name is the
person's uid) and rewritten whole, under a lock, at every server start: hubs sharing a machine
(the test suite runs several) never undo each other's rules, and a firewall reload that dropped
the table is undone at the next start. Groups are never removed: an empty one costs nothing,
and removing one could race with a server being placed in it.

Abstract Unix sockets (no file, no permission) are invisible to nftables: each server also
enters a Landlock domain of its own (:mod:`tunehub_base.landlock`). A person's own trials are
islands and so do not reach their notebook's listeners either. ``TUNEHUB_NETWORK_ISLANDS=0``
turns this off with the trials' islands.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tunehub_base.cgroups.mounts import MOUNTINFO, cgroup_mounts
from tunehub_base.system_tools import system_argv, system_tool

#: The parent of the people's groups, at the top of the v2 hierarchy.
PEOPLE_GROUPS = "tunehub-people"
NFT_TABLE = "tunehub_people"
#: Set in every mark the table writes, so that root's (uid 0) differs from no mark at all.
MARK_FLAG = 0x80000000
#: Serialises rewrites of the table between hubs on one machine (root's).
LOCK = Path("/run/tunehub-people.lock")
#: nftables names a cgroup v2 group by its path below this directory.
NFT_CGROUP_ROOT = Path("/sys/fs/cgroup")
NFT_SECONDS = 30
#: How long what a stopped server left may take to die before it is reported.
KILL_SECONDS = 10.0


class FenceUnavailable(RuntimeError):
    """The fence cannot be made on this machine; the message says why."""


@dataclass(frozen=True)
class NetworkFence:
    """The machine's people's groups and the table that fences them."""

    groups: Path  # <v2 mount>/tunehub-people
    nft_path: str  # the same, as nftables names it (below /sys/fs/cgroup)

    @classmethod
    def open(cls, mountinfo: Path = MOUNTINFO) -> NetworkFence:
        """The fence, its parent group made; :class:`FenceUnavailable` with the reason where
        the machine cannot have one (not root, no ``nft``, no cgroup v2 hierarchy that
        nftables can name)."""
        if os.geteuid() != 0:
            raise FenceUnavailable("the hub is not root")
        if system_tool("nft") is None:
            raise FenceUnavailable("no nft on this machine (make up installs nftables)")
        problems = []
        for mount_root, point in cgroup_mounts((), mountinfo).get("cgroup2", []):
            if mount_root != "/":
                problems.append(f"{point} is a part of the hierarchy, not its root")
                continue
            try:
                below = point.relative_to(NFT_CGROUP_ROOT)
            except ValueError:
                problems.append(f"{point} is not below {NFT_CGROUP_ROOT}, where nft looks")
                continue
            groups = point / PEOPLE_GROUPS
            try:
                groups.mkdir(mode=0o755, exist_ok=True)
            except OSError as exc:
                problems.append(f"{groups}: {exc.strerror or exc}")
                continue
            return cls(groups, str(below / PEOPLE_GROUPS))
        raise FenceUnavailable("no usable cgroup v2 hierarchy: " + ("; ".join(problems)
                                                                     or "none mounted"))

    def admit(self, uid: int, server: str) -> Path:
        """Person ``uid``'s group (made if new) with the table rewritten to fence it, and in it
        a fresh group for their server named ``server`` (what a previous run of it left is
        killed first): that group's ``cgroup.procs``, where root writes the server's pid before
        it runs. Raises :class:`FenceUnavailable` when ``nft`` refuses the table."""
        with LOCK.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            person = self.groups / str(uid)
            person.mkdir(mode=0o755, exist_ok=True)
            done = subprocess.run(system_argv(["nft", "-f", "-"]), input=self.rules(), text=True,
                                  capture_output=True, timeout=NFT_SECONDS, check=False)
        if done.returncode != 0:
            raise FenceUnavailable(f"nft refused the people's table: {done.stderr.strip()}")
        if not end_group(self.server_group(uid, server)):
            raise FenceUnavailable(f"what {server or 'the server'} left from its last run "
                                   f"would not end in {KILL_SECONDS:.0f} s")
        group = self.server_group(uid, server)
        group.mkdir(mode=0o755)
        return group / "cgroup.procs"

    def server_group(self, uid: int, server: str) -> Path:
        """Where person ``uid``'s server ``server`` ("" for the default one) and all it starts
        live (below the person's group, so the person's fence covers it)."""
        return self.groups / server_group_path(uid, server)

    def people(self) -> list[int]:
        """The uids that have a group."""
        return sorted(int(p.name) for p in self.groups.iterdir()
                      if p.name.isdigit() and p.is_dir())

    def rules(self) -> str:
        """The whole table, for ``nft -f`` (created, deleted and made again in one
        transaction, so it is never there twice nor missing in between)."""
        uids = self.people()
        marks = ", ".join(f"{uid} : {mark(uid):#x}" for uid in [0, *uids])
        fences = "".join(
            f'    ct state new socket cgroupv2 level 2 "{self.nft_path}/{uid}" '
            f"ct mark != {{ {mark(0):#x}, {mark(uid):#x} }} reject\n" for uid in uids)
        return (
            f"table inet {NFT_TABLE} {{}}\n"
            f"delete table inet {NFT_TABLE}\n"
            f"table inet {NFT_TABLE} {{\n"
            "  chain output { type filter hook output priority filter; policy accept;\n"
            f"    ct state new fib daddr type local ct mark set meta skuid map {{ {marks} }}\n"
            "  }\n"
            "  chain input { type filter hook input priority filter; policy accept;\n"
            f"{fences}"
            "  }\n"
            "}\n"
        )


def server_group_path(uid: int, server: str) -> str:
    """Person ``uid``'s server ``server``'s group below :data:`PEOPLE_GROUPS`, the same in
    every hierarchy (the fence's v2 one, and the limits' v1 ones: :mod:`hub.server_limits`)."""
    safe = "".join(c if c.isalnum() or c in "-_." else f"%{ord(c):x}" for c in server)
    return f"{uid}/server-{safe}"


def end_group(group: Path) -> bool:
    """Kill everything in ``group`` (a server's, when it stops: its double forks and
    ``nohup`` jobs too, which would go on using its GPUs) and remove it. False if it would not
    empty in :data:`KILL_SECONDS`. ``cgroup.kill`` (Linux 5.14+) kills the group at once,
    without a pid read and signalled later; before it, pid by pid."""
    deadline = time.monotonic() + KILL_SECONDS
    while True:
        try:
            events = (group / "cgroup.events").read_text()
        except FileNotFoundError:
            return True  # no such group
        if "populated 0" in events:
            with contextlib.suppress(FileNotFoundError):  # ended by another call meanwhile
                group.rmdir()
            return True
        if time.monotonic() > deadline:
            return False
        if (group / "cgroup.kill").exists():
            (group / "cgroup.kill").write_text("1")
        else:
            for pid in (group / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.01)  # the kernel's exit work for what was just killed


def mark(uid: int) -> int:
    """The conntrack mark of a connection opened by ``uid``."""
    return MARK_FLAG | uid


def enter(procs: Path) -> None:
    """Put the calling process in the group whose ``cgroup.procs`` is ``procs`` (a server's
    child, as root, before it drops its privileges and runs anything of the person's)."""
    with procs.open("w") as f:
        f.write("0")
