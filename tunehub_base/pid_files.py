"""Processes named by another program's bare pid file (JupyterHub's proxy pid file).

A bare pid can be reused; the process at that pid is taken to be the one the file names only
if it started before the file was written and its command line holds ``marker``.
"""

from __future__ import annotations

import ctypes
import os
import signal
from pathlib import Path

from tunehub_base.process_identity import ProcessIdentity

#: Seconds a process's start may seem to follow its pid file's writing (the boot time it is
#: reckoned from is whole seconds).
PID_FILE_SLACK = 2.0
_PR_SET_PDEATHSIG = 1


def recorded_process(pid_file: Path, marker: bytes) -> ProcessIdentity | None:
    """The live process ``pid_file`` names, or None (no file, no such process, or a later
    process that took the pid since)."""
    try:
        pid = int(pid_file.read_text().strip())
        written = pid_file.stat().st_mtime
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        identity = ProcessIdentity.of(pid)
    except (OSError, ValueError):
        return None
    started = identity.started_at()
    if started is not None and started > written + PID_FILE_SLACK:
        return None
    return identity if marker in cmdline else None


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Have the kernel send ``sig`` to this process when its parent exits (Linux; elsewhere a
    no-op): a hub-managed service must not outlive a hub that was killed, holding its port
    when the next hub starts it again."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig))
    except (OSError, AttributeError):
        pass


def started_by_hub() -> bool:
    """Is this process's parent JupyterHub (a managed service), not a container's init or a
    person's shell (the tuner in its own Deployment, or run by hand)?"""
    try:
        args = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(os.path.basename(arg) == b"jupyterhub" for arg in args[:2])
