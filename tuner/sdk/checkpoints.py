"""A trial's checkpoint: what an attempt saves so the next attempt of the same trial resumes.

Every trial (not attempt) has a checkpoint directory, ``TUNEHUB_CHECKPOINT_DIR``
(``<trial>/checkpoints``, next to ``artifacts`` on the same volume), that outlives its
attempts: a retry (``max_retries``) or a rerun after the controller died finds there what the
attempt before it saved. ``tuner.checkpoint(state, step)`` keeps one checkpoint, the latest;
``tuner.restore()`` gives it back as ``(state, step)``, or ``None`` when the trial has none yet
(the first attempt, or a trial that never checkpoints: it restarts from scratch).

**Why atomic.** An attempt can die at any instant: SIGKILL at its ``trial_timeout``, the OOM
killer, a node lost, a preemption whose grace period ran out. A checkpoint written in place and
cut halfway would be the next attempt's starting point: a torn pickle fails every later attempt
(each one restores it), or worse loads half a state. So the state is written to a temporary file
in the same directory, flushed to disk (``fsync``), and only then renamed over ``checkpoint.pkl``:
``rename`` is atomic on POSIX, so a reader sees the whole old checkpoint or the whole new one,
never a mix. The directory is synced too, so the rename itself survives a crash of the machine.

**Links.** The directory is the person's and this code runs as the person, so there is nothing
to gain by planting a link; still, nothing here follows one: the directory is opened with
``O_NOFOLLOW``, files are opened relative to it with ``O_NOFOLLOW`` (a link at
``checkpoint.pkl`` is an error, not a path to write through), and ``rename`` replaces a link
instead of writing where it points.

The state is pickled (numpy arrays, nested dicts, anything picklable): only this trial's own
attempts write and read it. Outside a sweep (no ``TUNEHUB_CHECKPOINT_DIR``) ``checkpoint`` is a
no-op and ``restore`` returns ``None``, so a script runs unchanged in a notebook; in a
multi-worker trial only the chief writes (:func:`tuner.is_chief`), every worker restores.

Only the standard library is imported here so a trial starts fast.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tuner.sdk.training import ENV_CHECKPOINT_DIR, is_chief, send_held_reports

#: The one checkpoint a trial keeps (the latest).
CHECKPOINT_FILE = "checkpoint.pkl"
_TEMP_PREFIX = ".checkpoint."
_TEMP_SUFFIX = ".tmp"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FORMAT = 1


def checkpoint_dir() -> Path | None:
    """This trial's checkpoint directory (kept across its attempts); ``None`` outside a sweep."""
    path = os.environ.get(ENV_CHECKPOINT_DIR)
    return Path(path) if path else None


@contextlib.contextmanager
def _open_dir(create: bool) -> Iterator[int | None]:
    path = checkpoint_dir()
    if path is None:
        yield None
        return
    if create:
        path.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        if create:
            raise
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


def checkpoint(state: dict[str, Any], step: int) -> None:
    """Save ``state`` (picklable) as this trial's checkpoint at ``step`` (e.g. the number of
    epochs done), replacing the previous one atomically (see the module text). A no-op outside a
    sweep and on the workers of a multi-worker trial other than the chief."""
    if not isinstance(state, dict):
        raise TypeError(f"a checkpoint's state is a dict, not {type(state).__name__}")
    step = int(step)
    if not is_chief():
        return
    send_held_reports()  # the steps up to this checkpoint are the tuner's before it is saved
    # Two pickles in one file: a small header first, so the step is read without the state.
    payload = (pickle.dumps({"format": _FORMAT, "step": step}, protocol=pickle.HIGHEST_PROTOCOL)
               + pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))
    with _open_dir(create=True) as dfd:
        if dfd is None:
            return
        _remove_stale_temps(dfd)
        temp = f"{_TEMP_PREFIX}{os.getpid()}.{secrets.token_hex(4)}{_TEMP_SUFFIX}"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(payload)
                fh.flush()
                os.fsync(fh.fileno())
            os.rename(temp, CHECKPOINT_FILE, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=dfd)
            raise
        with contextlib.suppress(OSError):  # some filesystems refuse a directory's fsync
            os.fsync(dfd)


def restore() -> tuple[dict[str, Any], int] | None:
    """The trial's latest checkpoint as ``(state, step)``, or ``None`` when there is none (the
    first attempt, a trial that never checkpoints, or outside a sweep)."""
    return _read(with_state=True)


def resume_step() -> int:
    """The step of the trial's latest checkpoint (0 without one): where this attempt resumes.
    Only the checkpoint's header is read. For Keras, :func:`tuner.keras.initial_epoch`."""
    found = _read(with_state=False)
    return 0 if found is None else found[1]


def _read(with_state: bool) -> tuple[dict[str, Any], int] | None:
    with _open_dir(create=False) as dfd:
        if dfd is None:
            return None
        try:
            fd = os.open(CHECKPOINT_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
                         | os.O_NONBLOCK, dir_fd=dfd)
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise OSError(errno.EINVAL, "the checkpoint is not a regular file",
                              CHECKPOINT_FILE)
            os.set_blocking(fh.fileno(), True)
            header = pickle.load(fh)
            state = pickle.load(fh) if with_state else {}
    return dict(state), int(header["step"])


def _remove_stale_temps(dfd: int) -> None:
    """Temporary files an attempt killed mid-write left behind (only the chief writes, one
    checkpoint at a time, so any temp file here is stale)."""
    for name in os.listdir(dfd):
        if name.startswith(_TEMP_PREFIX) and name.endswith(_TEMP_SUFFIX):
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dfd)
