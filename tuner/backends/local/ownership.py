"""Who owns which file of a sweep when trials run as their owner's system user.

The tuner runs as root; a person's trials run as their own user (:mod:`tunehub_base.unix_users`).
Root must then never act on a path that person controls as if it were its own: a ``trial.log``
swapped for a symlink to the hub's cookie secret would otherwise be served back by the logs API, and
a SavedModel holding such a link would be copied into the registry. So:

- ``sweeps/<id>`` and ``sweeps/<id>/trials`` stay root's (mode 0711: passable, not listable);
- the code snapshot is copied *as the owner* (what they cannot read, they cannot snapshot) into
  ``sweeps/<id>/code``, owned by them;
- a trial's directory is root's with the owner's private group and the sticky bit (1770): the
  trial writes there, but cannot remove or replace root's files in it (``trial.log``, 0640:
  the owner reads it, only the tuner writes it, with what came through the attempt's pipes,
  :mod:`tuner.backends.local.log_pipes`; and the pid files);
- ``artifacts/`` is the owner's while an attempt runs and is *sealed* when it ends: walked
  top-down through directory descriptors (never following a link), symbolic links dropped, every
  entry made root's and read-only. The registry copies only sealed trees.
- ``checkpoints/`` (``TUNEHUB_CHECKPOINT_DIR``) is the owner's at every attempt's start and
  never sealed: the next attempt of the trial reads and replaces what the last one saved. The
  tuner never reads it; it is handed over like the artifacts (links dropped, files the owner's).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tunehub_base.unix_users import UnixUser, answer_as, privilege_dropper
from tuner.backends._base import Ignore
from tuner.snapshot import CODE_SNAPSHOT_LIMIT, CodeSource, copy_snapshot
from tuner.spec import SpecError
from tuner.untrusted_files import open_regular

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def hand_over(workdir: Path, log_path: Path, artifact_dir: Path, user: UnixUser,
              checkpoint_dir: Path | None = None) -> None:
    """Make an attempt's files usable by ``user`` (see the module text for the layout)."""
    for directory in (workdir.parent.parent, workdir.parent):
        _set_dir(directory, 0, 0, 0o711)
    _set_dir(workdir, 0, user.gid, 0o1770)
    fd = open_regular(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    try:
        os.fchown(fd, 0, user.gid)
        os.fchmod(fd, 0o640)
    finally:
        os.close(fd)
    artifact_dir.mkdir(parents=True, exist_ok=True)
    chown_tree(artifact_dir, user.uid, user.gid, dir_mode=0o700)
    if checkpoint_dir is not None:
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        chown_tree(checkpoint_dir, user.uid, user.gid, dir_mode=0o700)


def seal(artifact_dir: Path) -> None:
    """After an attempt: the artifacts become root's, read-only, without symbolic links."""
    try:
        chown_tree(artifact_dir, 0, 0, dir_mode=0o755)
    except FileNotFoundError:
        pass


def chown_tree(top: Path, uid: int, gid: int, dir_mode: int) -> None:
    """Give ``top`` and everything under it to ``uid:gid``, top-down through directory file
    descriptors (``openat`` with ``O_NOFOLLOW``): a link or a rename by the old owner while
    this runs can never redirect it outside ``top``. Symbolic links are removed; files with
    several hard links are left alone (they might be someone else's file)."""
    fd = os.open(top, _DIR_FLAGS)
    try:
        _chown_dir(fd, uid, gid, dir_mode)
    finally:
        os.close(fd)


def _chown_dir(fd: int, uid: int, gid: int, dir_mode: int) -> None:
    os.fchown(fd, uid, gid)
    os.fchmod(fd, dir_mode)
    for name in os.listdir(fd):
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                os.unlink(name, dir_fd=fd)
            elif stat.S_ISDIR(st.st_mode):
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                try:
                    _chown_dir(child, uid, gid, dir_mode)
                finally:
                    os.close(child)
            elif stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                child = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                                dir_fd=fd)
                try:
                    os.fchown(child, uid, gid)
                    os.fchmod(child, stat.S_IMODE(st.st_mode) & 0o755 | 0o600)
                finally:
                    os.close(child)
            elif not stat.S_ISREG(st.st_mode):
                os.unlink(name, dir_fd=fd)  # fifos, sockets, devices: nothing a model needs
        except FileNotFoundError:
            continue  # removed while we walked


def snapshot_as(
    user: UnixUser,
    source: CodeSource | Path | None,
    target: Path,
    ignore: Ignore,
    files: dict[str, bytes],
) -> None:
    """Copy ``source`` (and ``files``) into ``target`` in a child process running as ``user``,
    so the snapshot holds only what that person can read. ``OSError`` carries their error."""
    target.parent.mkdir(parents=True, exist_ok=True)
    _set_dir(target.parent, 0, 0, 0o711)
    os.mkdir(target, 0o700)
    os.chown(target, user.uid, user.gid)

    def copy() -> bytes:
        if source is not None:
            copy_snapshot(source, target, ignore, CODE_SNAPSHOT_LIMIT)
        for name, data in files.items():
            (target / name).write_bytes(data)
        return b""

    answer = answer_as(privilege_dropper(user), copy)
    if answer.error == SpecError.__name__:  # the code refused (a link on the way, too big, ...)
        raise SpecError("code", answer.data.decode(errors="replace"))
    if not answer.ok:
        raise PermissionError(answer.data.decode(errors="replace")
                              or f"copying the code as {user.login} failed")


def _set_dir(path: Path, uid: int, gid: int, mode: int) -> None:
    fd = os.open(path, _DIR_FLAGS)
    try:
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
