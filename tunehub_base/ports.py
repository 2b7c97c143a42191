"""Who holds a TCP port: for the one line a platform process prints when the port it must listen
on is taken, instead of a bare "address in use" (and instead of serving nothing)."""

from __future__ import annotations

import os
import pwd
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
