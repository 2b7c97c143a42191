"""A trial that ran out of disk says so in its reason, not only "exited with code 1".

A trial whose checkpoint, model or other output meets a full filesystem (``ENOSPC``: the data
store or the volume holding tunehub's home, a spent quota) fails like any failed trial. Its
traceback is in its log when the log had room, and the sweep's reason quotes that log; the
trial's own reason, the one ``sweep show`` and the API give per trial, is the exit alone. When
the attempt's output names ``ENOSPC`` (every library says it with the C library's words, ``No
space left on device``), or its log itself could not be written for want of space, the reason
says so first, with the line that said it and how much room the disk holding the trial's files
has now, so the person knows it is the disk, and which one, before reading any log.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

#: How every library words ``ENOSPC`` (``strerror``): Python's ``OSError``, TensorFlow, HDF5.
NO_SPACE = os.strerror(errno.ENOSPC)
#: The longest quoted line of the trial's output.
MAX_LINE = 300


def no_space_reason(exit_reason: str, output: bytes, log_error: OSError | None,
                    files: Path) -> str | None:
    """The reason of a failed attempt that ran out of disk, or ``None`` when nothing says it
    did. ``exit_reason``: how it exited (``exited with code 1``); ``output``: the end of its
    output; ``log_error``: the error writing that output to its log, if any; ``files``: a
    directory of the trial's on the disk its checkpoints and models go to."""
    said = [line.strip() for line in output.decode(errors="replace").splitlines()
            if NO_SPACE in line]
    log_full = log_error is not None and log_error.errno == errno.ENOSPC
    if not said and not log_full:
        return None
    parts = [f"no space left on device: {said[-1][:MAX_LINE]}" if said
             else "no space left on device"]
    if log_full:
        parts.append("its log could not take its output")
    parts.append(exit_reason)
    room = _room(files)
    if room is not None:
        parts.append(f"the disk holding its files ({files}) has {room} now")
    return "; ".join(parts)


def _room(path: Path) -> str | None:
    """``"12.0 KiB free of 1.0 MiB"`` for the filesystem holding ``path``."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return f"{_size(st.f_bavail * st.f_frsize)} free of {_size(st.f_blocks * st.f_frsize)}"


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
