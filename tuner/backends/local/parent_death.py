"""Trial processes die with the process that started them.

``PR_SET_PDEATHSIG``: the kernel sends SIGKILL to the caller when its parent exits, so a killed
controller (or warm-start zygote) never leaves trials running and reporting into the void. Used
between fork and exec by the local backend's cold starts and by the zygote and its children.
"""

from __future__ import annotations

import ctypes
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies (Linux; elsewhere a no-op)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass
