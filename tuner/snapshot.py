"""Code snapshots: where a sweep's code may come from, and copying it without following links.

The tuner copies a sweep's ``code`` directory into the sweep (``<home>/sweeps/<id>/code``); its
trials run that copy, and their logs are readable by the sweep's owner. So the copy must contain
nothing the owner could not read already:

- Through the service (REST API, notebook client), ``code`` must be a directory inside the
  data store (``TUNEHUB_DATA``) once its links are resolved with the owner's rights (the
  notebook's ``~/data`` is one), not inside tunehub's own state
  (:meth:`tunehub_base.settings.Settings.is_state`: the home but for a data store inside it,
  where every sweep, the hub's state and the secrets live; the model registry; a SQLite
  database) and not inside another person's area of the data store (``<data>/users/<name>``,
  :mod:`tunehub_base.datastore`). A path into another person's area is refused on its words,
  and links are resolved only as far as the owner could, so the answer about another person's
  area never depends on what is in it. The tuner's own files (its ServiceAccount token, its
  environment with the database URL, the hub's state) all lie outside the data store. The
  single-user CLI keeps free paths: it runs as the person at the terminal, who can read
  whatever it can.
- The code directory is reached from the data root one component at a time (``openat`` with
  ``O_NOFOLLOW|O_DIRECTORY``), at the check and again at the copy, each directory judged on what
  was opened (``fstat``), never on a path looked at earlier: a directory swapped for a link
  between the check and the copy stops the copy; nothing of the link's target is read. When
  people have Unix users of their own, every directory on the way and everything copied must be
  changeable only by the submitter or root (:func:`judge`): someone else's directory, or one
  others may write to (a sticky one on the way, like the data root, excepted), is a 400 on
  ``code``.
- Below it, entries are opened relative to their directory's descriptor with ``O_NOFOLLOW``:
  only directories and regular files are copied (files opened ``O_NONBLOCK``: a FIFO is
  skipped, never waited on). Links are copied as links and then kept only if they resolve
  inside the snapshot; a link pointing outside (``data -> /var/run/secrets/...``) is left out,
  so a trial cannot read through it.
- Parts of tunehub's state inside ``code`` (the home, data store, registry, other users' areas)
  are left out, as are version control and caches.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tunehub_base import unix_users
from tunehub_base.datastore import users_dir
from tunehub_base.settings import Settings, inside
from tuner.spec import SpecError

log = logging.getLogger("tunehub.snapshot")

CODE_SNAPSHOT_LIMIT = 100 * 1024 * 1024
_SNAPSHOT_IGNORE = shutil.ignore_patterns(
    ".git", "__pycache__", "*.pyc", ".venv", "venv", "tunehub-artifacts", ".ipynb_checkpoints"
)
_CHUNK = 1024 * 1024
_DIR_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC
# Directories on the way are only passed: a descriptor that can be walked from and fstat'ed, not
# read (``users/`` is 0711: its owner alone may list it).
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC

Ignore = Callable[[str, list[str]], set[str]]


@dataclass(frozen=True)
class Owner:
    """Whose code a snapshot is, as the file system knows them: their Unix user (``uid``), its
    private group (``gid``) and every group it is in (``groups``)."""

    uid: int
    gid: int
    groups: frozenset[int]


@dataclass(frozen=True)
class CodeSource:
    """Where a snapshot is copied from: ``root``, a directory the platform names (the data
    store; for the single-user CLI the code directory itself), and ``parts`` below it, walked
    one component at a time without following links. With ``owner`` (people have Unix users of
    their own), every directory on the way and everything copied is judged against them:
    :func:`judge`."""

    root: Path
    parts: tuple[str, ...] = ()
    owner: Owner | None = None

    @property
    def path(self) -> Path:
        return self.root.joinpath(*self.parts)

    def __str__(self) -> str:
        return str(self.path)


def code_owner(settings: Settings, user: str) -> Owner | None:
    """The Unix user whose rights ``user``'s code is judged by; ``None`` when everyone's
    processes share one Unix user (no root, or Kubernetes: mounts keep people apart there)."""
    if not unix_users.enabled():
        return None
    found = unix_users.UnixUsers.from_env(settings.home).lookup(user)
    if found is None:
        raise SpecError("owner", f"account {user!r} has no system user; tunehub runs nothing "
                        "of a person's as root")
    return Owner(found.uid, found.gid, frozenset(os.getgrouplist(found.login, found.gid)))


def check_service_code(code: str, settings: Settings, user: str,
                       owner: Owner | None = None) -> CodeSource:
    """Where a service user's ``code`` is copied from, or a :class:`SpecError` naming ``code``
    and where code may live.

    A path into another person's area is refused on its words, before anything is looked at.
    Then its links are resolved *as the owner* (the notebook's ``~/data`` is a link to the data
    store), so the resolution sees no more than they could; the resolved path is judged by its
    words again (inside the data store, not tunehub's state, not another person's area) and
    walked from the data root as :func:`open_code` does, stopping at the first directory that
    is not the caller's to use, whatever lies below it. So the answer never tells whether a
    path in another person's area exists."""
    own = users_dir(settings) / user
    where = f"code may live in the data store ({settings.data})" + (
        f", e.g. your area {own}" if own.is_dir() else ""
    ) + ", outside tunehub's state and other users' areas"
    if not os.path.isabs(code):
        raise SpecError("code", f"expected an absolute path, got {code!r}; {where}")
    users = users_dir(settings)

    def judge_words(path: Path) -> None:
        if inside(path, users) and not inside(path, users / user):
            raise SpecError("code", f"{code} is not in your area of the data store; {where}")
        if settings.is_state(path):
            raise SpecError("code", f"{code} is tunehub's own state, not code; {where}")
        if not inside(path, settings.data):
            raise SpecError("code", f"{code} is outside the data store; {where}")

    raw = Path(os.path.normpath(code))
    if inside(raw, users) and not inside(raw, users / user):
        judge_words(raw)
    path = _resolve(str(raw), owner)
    judge_words(path)
    source = CodeSource(settings.data, path.relative_to(settings.data).parts, owner)
    try:
        os.close(open_code(source))
    except SpecError as exc:
        raise SpecError("code", f"{exc.message}; {where}") from None
    return source


def _resolve(path: str, owner: Owner | None) -> Path:
    """``path`` with its links resolved with ``owner``'s rights (a child process that becomes
    them): a link the tuner (root) could follow but they could not stays unresolved, so its
    target is never revealed to them. Without an owner, in this process."""
    if owner is None or os.geteuid() == owner.uid:
        return Path(os.path.realpath(path))
    answer = unix_users.answer_as(
        lambda: unix_users.become(owner.uid, owner.gid, sorted(owner.groups), f"uid {owner.uid}"),
        lambda: os.fsencode(os.path.realpath(path)))
    if not answer.ok or not answer.data:
        raise SpecError("code", f"{path} could not be resolved as its owner")
    return Path(os.fsdecode(answer.data))


def open_code(source: CodeSource) -> int:
    """A descriptor of the code directory, reached from ``source.root`` one component at a time
    (``openat`` with ``O_NOFOLLOW|O_DIRECTORY``), each judged on what was opened (``fstat``):
    a link anywhere on the way, or a directory swapped for one after an earlier check, is
    refused, never followed. The caller closes it."""
    fd = _open_dir(str(source.root), None, source.root, _PATH_FLAGS)
    try:
        for i, part in enumerate(source.parts):
            _judge_dir(os.fstat(fd), source.owner, source.root.joinpath(*source.parts[:i]),
                       last=False)
            child = _open_dir(part, fd, source.root.joinpath(*source.parts[:i + 1]),
                              _PATH_FLAGS)
            os.close(fd)
            fd = child
        # The code directory itself, opened again through its own descriptor for reading.
        code = _open_dir(".", fd, source.path, _DIR_FLAGS)
    finally:
        os.close(fd)
    try:
        _judge_dir(os.fstat(code), source.owner, source.path, last=True)
    except BaseException:
        os.close(code)
        raise
    return code


def _open_dir(name: str, dir_fd: int | None, shown: Path, flags: int) -> int:
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise SpecError("code", f"{shown} does not exist") from None
    except PermissionError:
        raise SpecError("code", f"{shown} cannot be read by you") from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise SpecError("code", f"{shown} is a link or not a directory; name the "
                            "directory itself (links are never followed)") from None
        raise


def judge(st: os.stat_result, owner: Owner | None) -> str | None:
    """Why the file or directory ``st`` may not be part of ``owner``'s code, or ``None``.

    One rule: only its owner or root may change it (its owner is one of them; nobody else
    may write to it: not the world, not a group but the owner's private one). Else someone
    else could put their code where ``owner``'s sweep runs it as ``owner``."""
    if owner is None:
        return None
    if st.st_uid not in (0, owner.uid):
        return "belongs to someone else"
    if st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and st.st_gid != owner.gid):
        return "is writable by others"
    return None


def _judge_dir(st: os.stat_result, owner: Owner | None, shown: Path, last: bool) -> None:
    """A directory on the way to the code (``last``: the code directory itself). On the way, a
    sticky directory writable by others passes (the data root, 3775): nobody but its owner or
    root can remove or rename the next one, which is judged in turn. A directory of root's
    that the owner cannot pass stops the walk with the same answer whatever lies below."""
    why = judge(st, owner)
    if why == "is writable by others" and not last and st.st_mode & stat.S_ISVTX:
        why = None
    if why is None and owner is not None and st.st_uid == 0 and not _passable(st, owner):
        why = "cannot be read by you"
    if why is not None:
        raise SpecError("code", f"{shown} {why}; code must lie in directories only you (or "
                        "root) can change")


def _passable(st: os.stat_result, owner: Owner) -> bool:
    if st.st_gid in owner.groups:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def snapshot_ignore(settings: Settings, user: str | None = None) -> Ignore:
    """What a code snapshot leaves out (a ``shutil.copytree``-style ignore): version control,
    caches, virtualenvs, and tunehub's own state (home, data store, registry) when it lies
    inside the code directory. Copying the home into a snapshot inside that home would never
    end. With ``user``, other users' areas of the data store are left out too."""
    state = {p.resolve() for p in (settings.home, settings.data, *settings.state_paths())}
    users = users_dir(settings).resolve()

    def ignore(directory: str, names: list[str]) -> set[str]:
        skipped = set(_SNAPSHOT_IGNORE(directory, names))
        for name in names:
            path = (Path(directory) / name).resolve()
            if path in state or (user is not None and path.parent == users and name != user):
                skipped.add(name)
        return skipped

    return ignore


def copy_snapshot(source: CodeSource | Path, target: Path, ignore: Ignore, limit: int
                  ) -> list[str]:
    """Copy ``source`` to ``target`` (created if missing) without ever following a link;
    returns the links left out because they point outside the snapshot.

    The code directory is reached again from the root (:func:`open_code`), not through a
    path checked earlier, and everything below it is opened relative to its directory's
    descriptor with ``O_NOFOLLOW`` and judged on what was opened: only directories and regular
    files are copied (files opened ``O_NONBLOCK``, so a FIFO cannot hang the copy), and with an
    owner, anything someone else could have changed (:func:`judge`) refuses the snapshot.
    Raises :class:`SpecError` on ``code`` for those, and when the copy grows beyond ``limit``
    bytes."""
    if isinstance(source, Path):
        source = CodeSource(source)
    target.mkdir(parents=True, exist_ok=True)  # may be prepared (owned) by the caller
    root_fd = open_code(source)
    copied = [0]
    try:
        _copy_dir(root_fd, str(source.path), target, ignore, limit, copied, source.owner)
    finally:
        os.close(root_fd)
    return _drop_escaping_links(target, source.path)


def _copy_dir(dir_fd: int, shown: str, target: Path, ignore: Ignore, limit: int,
              copied: list[int], owner: Owner | None) -> None:
    names = sorted(os.listdir(dir_fd))
    skipped = ignore(shown, names)
    for name in names:
        if name in skipped:
            continue
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            continue
        dest = target / name
        if stat.S_ISLNK(st.st_mode):
            link = os.readlink(name, dir_fd=dir_fd)
            os.symlink(link, dest)
        elif stat.S_ISDIR(st.st_mode):
            try:
                fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
            except OSError:
                continue  # replaced by a link (or vanished) since listing: not followed
            try:
                _refuse(os.fstat(fd), owner, os.path.join(shown, name))
                dest.mkdir()
                _copy_dir(fd, os.path.join(shown, name), dest, ignore, limit, copied, owner)
            finally:
                os.close(fd)
        elif stat.S_ISREG(st.st_mode):
            _copy_file(dir_fd, name, dest, limit, copied, owner, os.path.join(shown, name))
        # sockets, FIFOs, devices: not code


def _refuse(st: os.stat_result, owner: Owner | None, shown: str) -> None:
    why = judge(st, owner)
    if why is not None:
        raise SpecError("code", f"{shown} {why}; a snapshot holds only what you (or root) "
                        "alone can change")


def _copy_file(dir_fd: int, name: str, dest: Path, limit: int, copied: list[int],
               owner: Owner | None, shown: str) -> None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                     | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return  # a link now, or unreadable: left out
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return  # swapped for a FIFO or a device since listing: not code
        _refuse(st, owner, shown)
        with open(dest, "wb") as out:
            while chunk := os.read(fd, _CHUNK):
                copied[0] += len(chunk)
                if copied[0] > limit:
                    raise SpecError(
                        "code",
                        f"the code directory holds more than {limit // 2**20} MiB; keep data "
                        "in the data store and code small",
                    )
                out.write(chunk)
        os.chmod(dest, stat.S_IMODE(st.st_mode) | stat.S_IRUSR | stat.S_IWUSR)
    finally:
        os.close(fd)


def _drop_escaping_links(target: Path, source: Path) -> list[str]:
    """Keep a copied link only if it resolves inside the snapshot. An absolute link into the
    source directory is rewritten to the same place in the snapshot."""
    root = target.resolve()
    src = source.resolve()
    links = [
        Path(dirpath) / name
        for dirpath, dirnames, filenames in os.walk(target)
        for name in [*dirnames, *filenames]
        if (Path(dirpath) / name).is_symlink()
    ]
    for path in links:
        link = os.readlink(path)
        if os.path.isabs(link) and inside(Path(link), src):
            path.unlink()
            path.symlink_to(os.path.relpath(root / Path(link).relative_to(src), path.parent))
    # Decide for every link before removing any: a link to a link that leaves is left out too.
    escaping = [p for p in links if not inside(Path(os.path.realpath(p)), root)]
    for path in escaping:
        path.unlink()
    dropped = [str(p.relative_to(target)) for p in escaping]
    if dropped:
        log.info("snapshot of %s: left out links pointing outside it: %s", source, dropped)
    return dropped
