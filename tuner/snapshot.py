"""Code snapshots: where a sweep's code may come from, and copying it without following links.

The tuner copies a sweep's ``code`` directory into the sweep (``<home>/sweeps/<id>/code``); its
trials run that copy, and their logs are readable by the sweep's owner. So the copy must contain
nothing the owner could not read already:

- Through the service (REST API, notebook client), ``code`` must resolve, after symlinks, to a
  directory inside the data store (``TUNEHUB_DATA``), not inside tunehub's own state (its home:
  every sweep, the cookie secret; the model registry) and not inside another user's area of
  the data store (``<data>/users/<name>``, ``TUNEHUB_USERS_DIR``). The tuner's own files
  (its ServiceAccount token in ``/var/run/secrets``, its environment with the database URL,
  the hub's state) all lie outside the data store. The single-user CLI keeps free paths: it runs
  as the person at the terminal, who can read whatever it can.
- The copy never follows a symlink. Files are opened with ``O_NOFOLLOW`` relative to their
  directory's descriptor, so a link swapped in while copying is skipped, not read. Links are
  copied as links and then kept only if they resolve inside the snapshot; a link pointing
  outside (``data -> /var/run/secrets/...``) is left out, so a trial cannot read through it.
- Parts of tunehub's state inside ``code`` (the home, data store, registry, other users' areas)
  are left out, as are version control and caches.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

from tuner.settings import Settings
from tuner.spec import SpecError

log = logging.getLogger("tunehub.snapshot")

CODE_SNAPSHOT_LIMIT = 100 * 1024 * 1024
_SNAPSHOT_IGNORE = shutil.ignore_patterns(
    ".git", "__pycache__", "*.pyc", ".venv", "venv", "tunehub-artifacts", ".ipynb_checkpoints"
)
_CHUNK = 1024 * 1024

Ignore = Callable[[str, list[str]], set[str]]


def users_dir(settings: Settings) -> Path:
    """Per-user areas of the data store (the chart's ``data.usersSubPath``)."""
    raw = os.environ.get("TUNEHUB_USERS_DIR")
    return Path(raw).resolve() if raw else settings.data / "users"


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def check_service_code(code: str, settings: Settings, user: str) -> Path:
    """The resolved directory of a service user's ``code``, or a :class:`SpecError` naming
    ``code`` and where code may live."""
    own = users_dir(settings) / user
    where = f"code may live in the data store ({settings.data})" + (
        f", e.g. your area {own}" if own.is_dir() else ""
    ) + ", outside tunehub's state and other users' areas"
    raw = Path(code)
    if not raw.is_absolute():
        raise SpecError("code", f"expected an absolute path, got {code!r}; {where}")
    try:
        resolved = raw.resolve(strict=True)
    except (OSError, RuntimeError):
        raise SpecError("code", f"{code} does not exist; {where}") from None
    if not resolved.is_dir():
        raise SpecError("code", f"{code} is not a directory; {where}")
    if not _inside(resolved, settings.data):
        raise SpecError("code", f"{code} is outside the data store; {where}")
    forbidden = [settings.home, settings.registry]
    if any(_inside(resolved, p) for p in forbidden):
        raise SpecError("code", f"{code} is tunehub's own state, not code; {where}")
    users = users_dir(settings)
    if _inside(resolved, users) and not _inside(resolved, users / user):
        raise SpecError("code", f"{code} is not in your area of the data store; {where}")
    return resolved


def snapshot_ignore(settings: Settings, user: str | None = None) -> Ignore:
    """What a code snapshot leaves out (a ``shutil.copytree``-style ignore): version control,
    caches, virtualenvs, and tunehub's own state (home, data store, registry) when it lies
    inside the code directory. Copying the home into a snapshot inside that home would never
    end. With ``user``, other users' areas of the data store are left out too."""
    state = {p.resolve() for p in (settings.home, settings.data, settings.registry)}
    users = users_dir(settings).resolve()

    def ignore(directory: str, names: list[str]) -> set[str]:
        skipped = set(_SNAPSHOT_IGNORE(directory, names))
        for name in names:
            path = (Path(directory) / name).resolve()
            if path in state or (user is not None and path.parent == users and name != user):
                skipped.add(name)
        return skipped

    return ignore


def tree_size(root: Path, ignore: Ignore) -> int:
    """Bytes a snapshot of ``root`` would copy (links not followed)."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        skipped = ignore(dirpath, [*dirnames, *filenames])
        dirnames[:] = [d for d in dirnames if d not in skipped]
        for name in filenames:
            if name in skipped:
                continue
            try:
                total += (Path(dirpath) / name).lstat().st_size
            except OSError:
                continue
    return total


def copy_snapshot(source: Path, target: Path, ignore: Ignore, limit: int) -> list[str]:
    """Copy ``source`` to ``target`` (created if missing) without ever following a symlink;
    returns the links left out because they point outside the snapshot. Raises
    :class:`SpecError` on ``code`` when the copy grows beyond ``limit`` bytes."""
    target.mkdir(parents=True, exist_ok=True)  # may be prepared (owned) by the caller
    flags = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_DIRECTORY", 0)
    root_fd = os.open(source, flags)
    copied = [0]
    try:
        _copy_dir(root_fd, str(source), target, ignore, limit, copied)
    finally:
        os.close(root_fd)
    return _drop_escaping_links(target, source)


def _copy_dir(
    dir_fd: int, shown: str, target: Path, ignore: Ignore, limit: int, copied: list[int]
) -> None:
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
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_DIRECTORY", 0),
                             dir_fd=dir_fd)
            except OSError:
                continue  # replaced by a link (or vanished) since listing: not followed
            try:
                dest.mkdir()
                _copy_dir(fd, os.path.join(shown, name), dest, ignore, limit, copied)
            finally:
                os.close(fd)
        elif stat.S_ISREG(st.st_mode):
            _copy_file(dir_fd, name, dest, limit, copied)
        # sockets, FIFOs, devices: not code


def _copy_file(dir_fd: int, name: str, dest: Path, limit: int, copied: list[int]) -> None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return  # a link now, or unreadable: left out
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return
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
        os.chmod(dest, stat.S_IMODE(os.fstat(fd).st_mode) | stat.S_IRUSR | stat.S_IWUSR)
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
        if os.path.isabs(link) and _inside(Path(link), src):
            path.unlink()
            path.symlink_to(os.path.relpath(root / Path(link).relative_to(src), path.parent))
    # Decide for every link before removing any: a link to a link that leaves is left out too.
    escaping = [p for p in links if not _inside(Path(os.path.realpath(p)), root)]
    for path in escaping:
        path.unlink()
    dropped = [str(p.relative_to(target)) for p in escaping]
    if dropped:
        log.info("snapshot of %s: left out links pointing outside it: %s", source, dropped)
    return dropped
