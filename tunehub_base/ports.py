"""Who holds a TCP port: for the one line a platform process prints when the port it must listen
on is taken, instead of a bare "address in use" (and instead of serving nothing)."""

from __future__ import annotations

import os
import pwd
import random
import socket
from pathlib import Path

_LISTEN = "0A"  # the TCP state "listening" in /proc/net/tcp


def _listening_sockets(port: int) -> list[tuple[str, int]]:
    """(socket inode, owner's uid) of every listening socket on ``port``, IPv4 and IPv6."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == _LISTEN and _port_of(fields[1]) == port:
                found.append((fields[9], int(fields[7])))
    return found


def _port_of(address: str) -> int:
    """The port of a /proc/net/tcp address (``0100007F:1F90``: hexadecimal after the colon)."""
    return int(address.rsplit(":", 1)[1], 16)


def _pids_holding(inode: str) -> list[int]:
    target = f"socket:[{inode}]"
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) == target for fd in (proc / "fd").iterdir()):
                pids.append(int(proc.name))
        except OSError:  # gone, or not ours to look at (not root)
            continue
    return pids


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _command(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)[:120]


def holder(port: int) -> str:
    """Who listens on ``port``, as far as this process may see: user, pid and command."""
    sockets = _listening_sockets(port)
    if not sockets:
        return "no listening socket found (it may have just closed)"
    parts = []
    for inode, uid in sockets:
        pids = _pids_holding(inode)
        who = ", ".join(f"pid {pid} ({_command(pid)})" for pid in pids) or "pid not visible"
        parts.append(f"user {_user(uid)}, {who}")
    return "; ".join(parts)


def in_use_message(what: str, host: str, port: int) -> str:
    """The line printed when ``what`` cannot listen on ``host:port``."""
    return (f"{what} cannot listen on {host}:{port}: the port is held by {holder(port)}. "
            "Stop that process (or free the port) and start again.")


#: Where :func:`unclaimed_port` picks: the 16k ports just below the kernel's ephemeral range.
_PICK_SPAN = 16384


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def unclaimed_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now that the kernel will not hand out by itself later.

    Why not ``bind(0)``: that returns a port of the ephemeral range, the range every outgoing
    connection on the machine takes its source port from, so in the moment between choosing the
    port and the platform's process binding it, any connection may take it ("address already in
    use" at the hub's start, seen in a full run of the suite). A port below that range is only
    ever taken by a process that asks for it by number; the pick is random, so two platforms
    started together do not pick alike."""
    low, high = _ephemeral_range()
    lowest = 1024 if low - _PICK_SPAN < 1024 else low - _PICK_SPAN
    candidates = range(lowest, low) if low > 1024 + 256 else range(high + 1, 65536)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for _ in range(200 if len(candidates) else 0):
        port = random.choice(candidates)
        with socket.socket(family) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise OSError(f"no free TCP port on {host} from {candidates.start} to {candidates.stop - 1}")


def unclaimed_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports as :func:`unclaimed_port` picks them."""
    chosen: list[int] = []
    while len(chosen) < count:
        port = unclaimed_port(host)
        if port not in chosen:
            chosen.append(port)
    return chosen
