"""One small JSON file in a directory of the platform's own, read and replaced safely.

Why one helper: the hub's reclaim reasons and the tuner's measured use of Kubernetes trial pods
are both small documents that privileged processes keep and read back after a restart. Every
open is relative to the directory opened once with ``O_NOFOLLOW`` (a link planted in place of
the file is neither read nor written through), a file is written whole under a temporary name
(0600) and renamed into place (never read half written), and reading never raises: a missing,
damaged, oversized file or a link reads as nothing (``None``), so no page fails on it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
from pathlib import Path
from typing import Any

log = logging.getLogger("tunehub.private_json")

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_BYTES = 16 * 1024 * 1024


def read_json(directory: Path, name: str, max_bytes: int = MAX_BYTES) -> Any:
    """The file's JSON, or None (missing, not JSON, over ``max_bytes``, or not a plain file)."""
    try:
        dir_fd = os.open(directory, _DIR)
    except OSError:
        return None
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except OSError as exc:
        if not isinstance(exc, FileNotFoundError):
            log.warning("%s in %s not read: %s", name, directory, exc)
        return None
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "rb") as fh:
        raw = fh.read(max_bytes + 1)
    if len(raw) > max_bytes:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None  # the next write replaces it


def write_json(directory: Path, name: str, data: Any) -> None:
    """Replace the file with ``data`` (the directory made 0700 if missing)."""
    body = json.dumps(data).encode()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    dir_fd = os.open(directory, _DIR)
    temp = f".{name}.{secrets.token_hex(4)}"
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=dir_fd)
        with os.fdopen(fd, "wb") as fh:
            fh.write(body)
            fh.flush()
            os.fsync(fh.fileno())
        os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp, dir_fd=dir_fd)
        os.close(dir_fd)
