"""The trial's directory as the tuner touches it: by descriptor, never through a link.

A trial pod writes its own directory (``<sweep>/trials/<n>``, mounted read-write) as the
trial uid, a uid other than the tuner's. The tuner's ServiceAccount token and environment are
in the tuner's pod, so a link the trial leaves there (``trial.log -> /proc/self/environ``) is
followed in the *tuner's* filesystem. Two rules keep that from ever happening:

- **The trial cannot replace what the tuner reads.** Before the Job exists, the tuner hands the
  directory to the trial's group with the sticky bit (``chmod 3775``, group = the trial gid):
  the trial writes new files there, but cannot unlink or rename the files the tuner owns —
  ``trial.log`` (``0644``, the tuner's: the trial cannot write into it either, unless a
  kubelet re-applies ``fsGroup`` to the volume, which adds group write but never lets it
  replace the file) and the links into the code snapshot. Nothing above its own directory
  is in the pod at all (:func:`tuner.backends.kubernetes.manifests.data_mounts`).
- **The tuner opens nothing by path.** Every open walks from the data store's root one
  component at a time with ``O_NOFOLLOW`` (``openat``), and the log is appended only to what
  ``fstat`` says is a regular file, opened ``O_NONBLOCK`` (a FIFO never blocks the tuner). The
  log's text comes from the pods' log API (:mod:`.job_pods`), never from a file in the volume.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from tuner.untrusted_files import open_regular

log = logging.getLogger("tunehub.backends.kubernetes")

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: The trial's directory: setgid (new files get the trial group), sticky (the trial removes
#: or renames only what it made), group-writable (the trial uid is in the group, not owner).
TRIAL_DIR_MODE = 0o3775
#: Its ``artifacts``: the trial writes its model there (read back by the registry's own
#: no-follow code, :mod:`tuner.serving.registry`).
ARTIFACTS_MODE = 0o2775
#: Its ``checkpoints`` (``TUNEHUB_CHECKPOINT_DIR``): the trial's attempts save and restore
#: there; the tuner never reads it. Like ``artifacts``: setgid, the trial group writes.
CHECKPOINTS_MODE = 0o2775
#: ``trial.log``: the tuner's, written only from the pods' log API.
LOG_MODE = 0o644


class NotBeneath(OSError):
    """A path outside the root it must be under."""


@contextlib.contextmanager
def open_dir(root: Path, path: Path) -> Iterator[int]:
    """A descriptor of directory ``path`` reached from ``root`` one component at a time,
    following no link (a link anywhere below ``root`` is ``ELOOP``/``ENOTDIR``)."""
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        raise NotBeneath(f"{path} is not under {root}") from None
    fd = os.open(root, _DIR)
    try:
        for part in parts:
            if part in ("", ".", ".."):
                raise NotBeneath(f"{path}: {part!r} in a path the tuner walks")
            child = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def hand_to_trial(root: Path, workdir: Path, log_path: Path, gid: int) -> None:
    """Make ``workdir`` writable by the trial's group while everything the tuner made there
    stays the tuner's (see the module docstring). Idempotent: every attempt calls it."""
    with open_dir(root, workdir) as fd:
        _share(fd, gid, TRIAL_DIR_MODE)
        for name, mode in (("artifacts", ARTIFACTS_MODE), ("checkpoints", CHECKPOINTS_MODE)):
            with contextlib.suppress(FileNotFoundError):
                sub = os.open(name, _DIR, dir_fd=fd)
                try:
                    _share(sub, gid, mode)
                finally:
                    os.close(sub)
        if log_path.parent == workdir:
            with contextlib.suppress(FileNotFoundError):
                lfd = os.open(log_path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                              | os.O_CLOEXEC, dir_fd=fd)
                try:
                    if stat.S_ISREG(os.fstat(lfd).st_mode):
                        os.fchmod(lfd, LOG_MODE)
                finally:
                    os.close(lfd)


def _share(fd: int, gid: int, mode: int) -> None:
    try:
        os.fchown(fd, -1, gid)
    except PermissionError:  # the tuner is not in the trial group: the chart makes it one
        log.warning("cannot give the trial group %d its directory (is the tuner in it?)", gid)
    os.fchmod(fd, mode)


def append_log(root: Path, path: Path, text: str) -> bool:
    """Append ``text`` to the trial's log at ``path`` (created if missing); False, and nothing
    written, when what is there is not a regular file (a link, a FIFO, a directory). The
    directories are walked from ``root`` without links; the file is opened by the one rule of
    :mod:`tuner.untrusted_files`."""
    with open_dir(root, path.parent) as dfd:
        try:
            fd = open_regular(path.name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, LOG_MODE,
                              dir_fd=dfd)
        except OSError as exc:  # ELOOP: a link; ENXIO: a FIFO nobody reads; not a file
            log.warning("not appending to %s: %s", path, exc.strerror or exc)
            return False
        with os.fdopen(fd, "ab") as fh:
            fh.write(text.encode())
        return True
