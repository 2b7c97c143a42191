"""The secret the hub's spawner shows the tuner when it asks for GPUs for a notebook.

Service to service on one machine: the hub (notebooks) and the tuner (trials) share the GPU
lock directory (``$TUNEHUB_HOME/gpu-locks``, the platform's own: root and 0700 under ``tunehub
up`` as root) and nothing else, so the secret lives there, beside the locks it is about. No
person can read it, nothing has to pass it from one process to the other, and neither needs
the other up first: whichever asks first makes it.

It lets its holder queue a notebook for GPUs and so stop trials (a preemption): it is never in
any environment a notebook or a trial inherits, and the tuner compares it in constant time.
Every open is relative to the directory, opened once, and never follows a link.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
from pathlib import Path

SECRET_FILE = "pool-secret"
SECRET_BYTES = 32


def pool_secret(lock_dir: Path) -> str:
    """The secret, made now (0600) if nobody has yet; a published file is never half
    written (written under a temporary name, then linked into place: a second maker's link
    fails and it reads the first one's)."""
    Path(lock_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
    dir_fd = os.open(lock_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        found = _read(dir_fd)
        if found:
            return found
        made = secrets.token_hex(SECRET_BYTES)
        temp = f".{SECRET_FILE}.{secrets.token_hex(4)}"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                     dir_fd=dir_fd)
        try:
            os.write(fd, made.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(temp, SECRET_FILE, src_dir_fd=dir_fd, dst_dir_fd=dir_fd,
                    follow_symlinks=False)
        except FileExistsError:
            made = _read(dir_fd) or made
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp, dir_fd=dir_fd)
        return made
    finally:
        os.close(dir_fd)


def matches(offered: str, lock_dir: Path) -> bool:
    """Whether ``offered`` is the secret (constant time)."""
    return bool(offered) and hmac.compare_digest(offered.encode(), pool_secret(lock_dir).encode())


def _read(dir_fd: int) -> str | None:
    try:
        fd = os.open(SECRET_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    try:
        return os.read(fd, 4 * SECRET_BYTES).decode().strip() or None
    finally:
        os.close(fd)
