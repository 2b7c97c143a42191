"""The content digest of a sweep's code snapshot, for a model version's lineage: which code
made it, as one ``sha256:...`` that changes when any file's name or bytes do.

The snapshot lives below the directory of all sweeps, which only the platform changes, but its
own directory may be shared with the sweep's trials (a pod's mount), so it is walked the way
the registry's intake walks a model (:mod:`tuner.serving.intake`): every component opened with
``openat`` relative to its parent, never following a link. A link or special file is named in
the digest (its kind and name), never followed or read.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from tuner.serving.intake import MAX_DEPTH, MAX_ENTRIES, ModelRefused, _Walk

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def tree_digest(root: Path, trusted: Path) -> str:
    """``sha256:<hex>`` over every entry below ``root`` (a directory below ``trusted``), in
    name order: each file's relative path and bytes, each link's or special file's kind and
    path. Raises :class:`ModelRefused` (with the reason) for a tree it will not walk."""
    try:
        relative = Path(os.path.abspath(root)).relative_to(os.path.abspath(trusted))
    except ValueError:
        raise ModelRefused(f"{root} is not inside {trusted}") from None
    digest = hashlib.sha256()
    fd = _Walk.open_below(trusted, relative.parts)
    try:
        _walk(fd, "", 0, digest, [0])
    finally:
        os.close(fd)
    return "sha256:" + digest.hexdigest()


def _walk(fd: int, where: str, depth: int, digest: hashlib._Hash, entries: list[int]) -> None:
    if depth > MAX_DEPTH:
        raise ModelRefused(f"{where or '.'}: deeper than {MAX_DEPTH} directories")
    for name in sorted(os.listdir(fd)):
        entries[0] += 1
        if entries[0] > MAX_ENTRIES:
            raise ModelRefused(f"more than {MAX_ENTRIES} entries")
        path = f"{where}{name}"
        mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
        if stat.S_ISDIR(mode):
            child = os.open(name, _DIR, dir_fd=fd)
            try:
                digest.update(b"D\0" + path.encode() + b"\0")
                _walk(child, path + "/", depth + 1, digest, entries)
            finally:
                os.close(child)
        elif stat.S_ISREG(mode):
            _file(fd, name, path, digest)
        else:  # a link, FIFO, socket or device: named, never opened
            digest.update(b"X\0" + path.encode() + b"\0" + str(stat.S_IFMT(mode)).encode())


def _file(fd: int, name: str, path: str, digest: hashlib._Hash) -> None:
    try:
        out = os.open(name, _FILE, dir_fd=fd)
    except OSError:  # swapped for a link since it was listed: named, not followed
        digest.update(b"X\0" + path.encode() + b"\0")
        return
    try:
        if not stat.S_ISREG(os.fstat(out).st_mode):
            digest.update(b"X\0" + path.encode() + b"\0")
            return
        digest.update(b"F\0" + path.encode() + b"\0")
        while chunk := os.read(out, 1 << 20):
            digest.update(chunk)
        digest.update(b"\0")
    finally:
        os.close(out)
