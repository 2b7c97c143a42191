"""Reading a file of a person's code snapshot as root, on their behalf, without reading
anything else.

The tuner (root, on a shared machine) reads a sweep's snapshot to decide what its warm starts
preload: the entry script, the helper modules it imports, a notebook function's pickle. The
snapshot is its owner's (:mod:`tuner.backends.local.ownership`), so they can swap any of those files
for a link to a file only root may read; following it would put names from that file (its
imports) into the warm process their trial forks from. A link is still followed (the trial's
directory links into the snapshot), but the file it ends at is judged by its descriptor, after
the open, so no swap between a check and the read can win: it must be a regular file, owned by
the person, and not too large.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: Larger files are not read (a snapshot's source files and pickles are far smaller).
MAX_BYTES = 8 * 2**20


def read_owned(path: Path, uid: int | None = None, limit: int = MAX_BYTES) -> bytes | None:
    """The bytes of ``path`` if it ends at a regular file owned by ``uid`` (default: this
    process's user) of at most ``limit`` bytes; None for anything else, or when it cannot be
    opened. Never blocks on a FIFO or device (``O_NONBLOCK``, then the type is checked)."""
    owner = os.geteuid() if uid is None else uid
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if st.st_uid != owner or not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        try:
            return fh.read(limit)
        except OSError:
            return None
