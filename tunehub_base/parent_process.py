"""A process's tie to its parent: die with it, and know who it is.

Managed services (the tuner's keeper and service, the culler) must not outlive a hub that was
killed: they would hold their ports when the next hub starts them again. Trial processes must
not outlive the controller or zygote that started them, reporting into the void. Both ask the
kernel for a signal when their parent exits (``PR_SET_PDEATHSIG``). A changed identity
(``setuid``) clears that request, so it is made after the switch.
"""

from __future__ import annotations

import ctypes
import os
import signal
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Have the kernel send ``sig`` to this process when its parent exits (Linux; elsewhere a
    no-op). Services ask for SIGTERM (a clean stop); trials for SIGKILL."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig))
    except (OSError, AttributeError):
        pass


def parent_runs(program: bytes) -> bool:
    """Whether this process's parent runs ``program``: its executable, its script, or its
    ``-m`` module among the first arguments of its command line (``jupyterhub`` for a
    hub-managed service, ``tuner.keeper`` for the kept tuner), not a container's init or a
    person's shell."""
    try:
        args = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(os.path.basename(arg) == program for arg in args[:3])
