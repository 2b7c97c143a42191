"""The data store's shape belongs to the platform: ``users/`` and each person's ``users/<name>``.

Why: the data store is shared (on one machine its root is ``root:tunehub`` 3775: everyone reads it
and adds entries), and people's sweeps run code from it. Anything one person could create where
another will later work (``users/bob`` before bob's account exists, a directory bob's ``code``
passes through) lets them put their code where bob's sweep runs it *as bob* (#31, item 2). So
the platform makes these directories itself and never trusts what it finds there:

=====================  ================================  ======================================
path                   owner, mode                       made / taken back
=====================  ================================  ======================================
data root              ``root:tunehub``, 3775            ``tunehub up`` (:mod:`tuner.cli.isolation`)
``users/``             root, 0711 (passable, not          ``tunehub up``; a directory someone else
                       listable)                         made there is re-owned root 0711 (then
                                                         nobody else adds to it again); a link or
                                                         a file is set aside
``examples/``          root, 0755                        ``tunehub up``, before seeding; anything
                                                         else found there is set aside
``users/<name>``       the person (their Unix user when  ``tunehub up`` for every account, and
                       Unix users are on), 0700; 0750    when an account is made; see below
                       kept when the person chose it
anything else          whoever made it                   shared: readable by everyone, the sticky
                                                         root keeps each entry its creator's; a
                                                         sweep's ``code`` is refused when a
                                                         directory on its way is someone else's
                                                         or writable by others
                                                         (:mod:`tuner.snapshot`)
=====================  ================================  ======================================

An existing ``users/<name>`` is kept only when the person owns it (its mode then loses what others
could do: 0700, or 0750 when it had group read), or when root owns it and nobody else can write
in it (it becomes the person's). Anything else (a link, a file, a directory of someone else's,
root's but writable by others) is *set aside*: renamed to
``users/.taken-back-<name>-<time>-<random>`` and made root's 0700 (for an admin to look at;
nobody else can reach it), and a fresh directory is made. Taking someone else's directory over
by ``chown`` would keep what they left inside and any descriptor they hold into it; setting it
aside keeps neither in the person's area.

Everything is done through directory descriptors (``openat`` with ``O_NOFOLLOW|O_DIRECTORY``) and
judged on what was opened (``fstat``), so a link swapped in meanwhile is never followed.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import stat
import time
from collections.abc import Callable
from pathlib import Path

from tunehub_base.options import setting
from tunehub_base.settings import Settings

log = logging.getLogger("tunehub.datastore")

ENV_USERS_DIR = "TUNEHUB_USERS_DIR"
USERS_MODE = 0o711
AREA_MODE = 0o700
EXAMPLES_MODE = 0o755
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
_ModeOf = Callable[[os.stat_result], int]
_Keep = Callable[[os.stat_result], bool]


class DataStoreError(RuntimeError):
    """The data store's shape cannot be made; the message is for the operator."""


def users_dir(settings: Settings) -> Path:
    """Per-person areas of the data store: ``TUNEHUB_USERS_DIR`` (the chart's
    ``data.usersSubPath``), else ``$TUNEHUB_DATA/users``."""
    raw = os.environ.get(ENV_USERS_DIR)
    return Path(raw).resolve() if raw else settings.data / "users"


def platform_makes_areas() -> bool:
    """Whether this process makes the areas: on one machine (``TUNEHUB_MODE=local``). On
    Kubernetes the chart's volume and its per-user ``subPath`` mounts are the shape."""
    return setting("TUNEHUB_MODE").text() == "local"


def prepare(settings: Settings) -> Path:
    """``users/`` and ``examples/`` as the platform's (``tunehub up``, before anyone logs in and
    before the examples are seeded: the seeding copies as root into ``examples/``, which must
    then be a directory nobody else can change or swap)."""
    users = users_dir(settings)
    os.close(_claim_users(users))
    me = os.geteuid()
    with _opened(settings.examples_dir.parent) as data_fd:
        os.close(_claim(data_fd, settings.examples_dir.name, me, os.getegid(),
                        lambda st: EXAMPLES_MODE,
                        lambda st: st.st_uid == me and not st.st_mode & _OTHERS_WRITE))
    return users


def ensure_area(settings: Settings, account: str, uid: int, gid: int) -> Path:
    """``users/<account>``, the person's (``uid:gid``), made now or judged and kept / set aside
    (see the module text). ``users/`` is claimed first, whatever state it is in."""
    if not account or account.startswith(".") or "/" in account:
        raise DataStoreError(f"account {account!r}: not a name for an area of the data store")
    users = users_dir(settings)
    users_fd = _claim_users(users)
    try:
        area_fd = _claim(users_fd, account, uid, gid, _area_mode,
                         lambda st: _theirs(st, uid))
        os.close(area_fd)
    finally:
        os.close(users_fd)
    return users / account


def _claim_users(users: Path) -> int:
    """``users/`` as a descriptor, the platform's (this process's user: root on one machine
    with Unix users), 0711, whoever made it."""
    users.parent.mkdir(parents=True, exist_ok=True)  # the data root: the operator's setting
    with _opened(users.parent) as parent_fd:
        return _claim(parent_fd, users.name, os.geteuid(), os.getegid(),
                      lambda st: USERS_MODE, lambda st: True)


def _theirs(st: os.stat_result, uid: int) -> bool:
    """Keep an existing area: the person's own, or root's with nobody else writing in it."""
    return st.st_uid == uid or (st.st_uid == 0 and not st.st_mode & _OTHERS_WRITE)


def _area_mode(st: os.stat_result) -> int:
    """0750 when the person gave their group read, else 0700; never anything for others."""
    return 0o750 if st.st_mode & stat.S_IRGRP else AREA_MODE


class _opened:
    """A directory the operator named (the data root), opened as a descriptor."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> int:
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise DataStoreError(f"the data store {self.path}: {exc.strerror}") from None
        return self.fd

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def _claim(parent_fd: int, name: str, uid: int, gid: int,
           mode: _ModeOf, keep: _Keep) -> int:
    """A descriptor of the directory ``name`` in ``parent_fd``, made if missing (0700 from
    birth, so nobody gets in before it is handed over), owned by ``uid:gid`` with ``mode(st)``.
    What is there and is not a directory, or is a directory ``keep`` rejects, is set aside."""
    for _ in range(5):
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
        except FileExistsError:
            pass
        try:
            fd = os.open(name, _DIR, dir_fd=parent_fd)
        except FileNotFoundError:
            continue  # removed since: make it again
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            _set_aside(parent_fd, name, "a link or not a directory")
            continue
        st = os.fstat(fd)
        if keep(st):
            if (st.st_uid, st.st_gid) != (uid, gid):
                os.fchown(fd, uid, gid)
            if stat.S_IMODE(st.st_mode) != mode(st):
                os.fchmod(fd, mode(st))
            if st.st_uid not in (uid, 0) or st.st_mode & _OTHERS_WRITE:
                log.warning("data store: %s was uid %d mode %o; taken back (now %d:%d %o)",
                            name, st.st_uid, stat.S_IMODE(st.st_mode), uid, gid, mode(st))
            return fd
        os.close(fd)
        _set_aside(parent_fd, name, f"uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}")
    raise DataStoreError(f"{name}: kept changing while the platform made it; try again")


def _set_aside(parent_fd: int, name: str, why: str) -> None:
    """Rename ``name`` out of the way (an unguessable name in the same directory) and, if it is
    a directory, make it root's 0700: what someone planted there stays for an admin to see,
    and reaches nobody."""
    aside = f".taken-back-{name}-{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(8)}"
    os.rename(name, aside, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
    log.warning("data store: %s (%s) was not made by the platform; set aside as %s",
                name, why, aside)
    try:
        fd = os.open(aside, _DIR, dir_fd=parent_fd)
    except OSError:
        return  # a link or a file: renamed is enough, nothing follows it
    try:
        if os.geteuid() == 0:
            os.fchown(fd, 0, 0)
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
