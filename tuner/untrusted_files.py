"""Opening a file that a person or their trial could have replaced, from a process that may
hold more rights than they do (the root tuner on one machine, the tuner's ServiceAccount on
Kubernetes).

One rule for every such open: the last component is never followed (``O_NOFOLLOW``), the open
never waits for a writer or reader (``O_NONBLOCK``: a FIFO put in a log's place cannot hang the
tuner's event loop or a worker thread), and what was opened is judged by its descriptor
(``fstat``), not by a path looked at earlier: anything but a regular file is refused. Reads of a
whole file are capped. Directories on the way are the platform's (a trial cannot rename what
the tuner later reads, see :mod:`tuner.backends.local.ownership`); where they may not be, the
caller walks them with :mod:`tuner.serving.intake`'s no-follow walk instead.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

_NO_FOLLOW = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class NotARegularFile(OSError):
    """The path holds a link, FIFO, socket, device or directory where a file was expected."""


def open_regular(path: Path | str, flags: int = os.O_RDONLY, mode: int = 0o600,
                 dir_fd: int | None = None) -> int:
    """A descriptor of the regular file at ``path`` (``flags`` as for :func:`os.open`; the
    no-follow, non-blocking and close-on-exec flags are added). A link is ``ELOOP`` from the
    kernel; anything else that is not a regular file raises :class:`NotARegularFile`. The
    descriptor is left blocking again for the caller's reads and writes (a regular file never
    blocks on ``O_NONBLOCK`` anyway)."""
    fd = os.open(path, flags | _NO_FOLLOW, mode, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotARegularFile(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_tail(path: Path | str, limit: int) -> tuple[bytes, int]:
    """The last ``limit`` bytes of the regular file at ``path`` and how many bytes came before
    them (0 when the whole file was read). Raises ``OSError`` as :func:`open_regular`."""
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fd).st_size
        skipped = max(0, size - limit)
        fh.seek(skipped)
        return fh.read(limit), skipped


def append(path: Path | str, data: bytes, mode: int = 0o640) -> None:
    """Append ``data`` to the regular file at ``path``, creating it (``mode``) if missing."""
    fd = open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode)
    with os.fdopen(fd, "ab") as fh:
        fh.write(data)
