"""When a running trial last saved a checkpoint, read from its checkpoint directory: the work
a preemption would throw away, which the pool's policy uses to pick the cheapest victim.

The directory is the trial owner's (``<trial>/checkpoints``, handed to them by
:mod:`tuner.backends.local.ownership`) and the tuner reading it is privileged, so nothing here
follows a link: the directory is opened with ``O_NOFOLLOW`` (its parents are root's), its
entries are ``lstat``-ed relative to that descriptor, and only regular files count. Nothing is
read, only metadata. The owner can set those times (``touch``); the worst that buys is their
own trial looking freshly checkpointed (stopped first) or never checkpointed (as if they never
saved), which is what the pool would assume of a trial that saves nothing anyway: the holding's
start bounds it from below (:class:`~tunehub_base.pool.request.Holding`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: Entries looked at, at most: a checkpoint directory holds one checkpoint and its temp file.
MAX_ENTRIES = 256


def last_checkpoint_at(directory: Path) -> float | None:
    """The newest modification time (seconds since the epoch) of a regular file directly in
    ``directory``; None when it holds none, is not a directory, is a link, or cannot be read."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    newest: float | None = None
    try:
        with os.scandir(fd) as entries:  # (scandir works on a duplicate of fd)
            for count, entry in enumerate(entries):
                if count >= MAX_ENTRIES:
                    break
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode) and (newest is None or st.st_mtime > newest):
                    newest = st.st_mtime
    except OSError:
        return None
    finally:
        os.close(fd)
    return newest
