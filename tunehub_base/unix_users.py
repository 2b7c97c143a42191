"""One system user per hub account, so people on one machine are separated by the OS.

Why: on a shared box every notebook server and trial used to run as the user running the hub;
with ``tunehub up`` as root that meant anyone's notebook cell could read the hub's cookie
secret, the accounts file and the tuner's database, and walk around every access check. When
``TUNEHUB_UNIX_USERS=1`` (``tunehub up`` sets it when started as root), each account ``NAME``
gets a system user ``tunehub-NAME`` (prefix: ``TUNEHUB_UNIX_USER_PREFIX``) with a private group
of its own, membership of the shared group ``tunehub`` (``TUNEHUB_UNIX_GROUP``: the data store's
group) and a home under ``$TUNEHUB_HOME/users/NAME``. Notebook servers and trials drop to that
user before running anything of the person's (JupyterHub ``LocalProcessSpawner`` semantics:
initgroups, setgid, setuid).

Safety rules: a system user is ours only if its GECOS field says ``tunehub account NAME``; an
existing user without that mark (``root``, someone's login, a name taken by hand) is never
reused: the account gets no system user and its servers and trials are refused with the reason.
A deleted account's user is locked (nologin, expired) with its files left in place; its
processes are killed.
"""

from __future__ import annotations

import fcntl
import grp
import hashlib
import os
import pwd
import re
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tunehub_base.system_tools import system_argv

ENV_ENABLED = "TUNEHUB_UNIX_USERS"
ENV_PREFIX = "TUNEHUB_UNIX_USER_PREFIX"
ENV_GROUP = "TUNEHUB_UNIX_GROUP"
DEFAULT_PREFIX = "tunehub-"
DEFAULT_GROUP = "tunehub"
MARK = "tunehub account "
LOGIN_SHELL = "/bin/bash"
RETIRED_SHELL = "/usr/sbin/nologin"
_MAX_LOGIN = 32  # Linux/shadow limit on user names
_ACCOUNT_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,31}$")
_LOGIN_UNSAFE = re.compile(r"[^a-z0-9_-]")
# What a process of a person may inherit from the platform's environment; anything else (the
# tuner's hub token, database URL, ...) stays with the platform.
ENV_KEEP = ("PATH", "LANG", "LANGUAGE", "TZ", "PYTHONPATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH",
            "TF_CPP_MIN_LOG_LEVEL")
ENV_KEEP_PREFIXES = ("LC_",)


class UnixUserError(RuntimeError):
    """A system user cannot be made or used for an account; the message is for people."""


def enabled(environ: dict[str, str] | os._Environ[str] | None = None) -> bool:
    """Isolation is on: asked for (``TUNEHUB_UNIX_USERS=1``) and we are root."""
    env = os.environ if environ is None else environ
    return env.get(ENV_ENABLED, "") in ("1", "true", "yes", "on") and os.geteuid() == 0


@dataclass(frozen=True)
class UnixUser:
    """The system user of one account."""

    account: str
    login: str
    uid: int
    gid: int
    home: Path
    retired: bool = False

    def environment(self, base: dict[str, str] | os._Environ[str]) -> dict[str, str]:
        """``base`` reduced to what a person's process may see, plus its own identity."""
        env = {k: v for k, v in base.items()
               if k in ENV_KEEP or k.startswith(ENV_KEEP_PREFIXES)}
        env.update(HOME=str(self.home), USER=self.login, LOGNAME=self.login, SHELL=LOGIN_SHELL)
        return env


def become(uid: int, gid: int, groups: list[int], name: str) -> None:
    """Make the calling process (a child between fork and exec, or one that exits after its
    work) this person for good: supplementary groups, then gid, then uid, as JupyterHub's
    ``set_user_setuid`` does. It raises rather than carrying on as root."""
    os.setgroups(groups)
    os.setgid(gid)
    os.setuid(uid)
    if os.geteuid() != uid or os.getegid() != gid or 0 in os.getgroups():
        raise PermissionError(f"could not drop privileges to {name}")
    os.umask(0o022)  # their files readable by their group, not writable


def privilege_dropper(user: UnixUser) -> Callable[[], None]:
    """A function that makes the calling process ``user`` (:func:`become`), for a child between
    fork and exec. The supplementary groups are looked up now, in the parent, so the child does
    not touch the group database."""
    groups = os.getgrouplist(user.login, user.gid)
    return lambda: become(user.uid, user.gid, groups, user.login)


@dataclass(frozen=True)
class ChildAnswer:
    """What :func:`answer_as` brought back: the work's bytes, or the text and class name of
    what it raised (``error`` is then set)."""

    data: bytes
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def answer_as(drop: Callable[[], None], work: Callable[[], bytes]) -> ChildAnswer:
    """Run ``work`` in a forked child that first calls ``drop`` (e.g. :func:`privilege_dropper`)
    and bring its bytes back over a pipe. Why: some questions must be answered with a person's
    rights, not root's (what can they read, where does their link lead); a child that becomes
    them and exits is the only way to ask the kernel, and this is the one place that forks,
    drops, answers and reaps. The child never returns into the caller's code."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 1
        try:
            os.close(read_end)
            try:
                drop()
                answer, code = b"0" + work(), 0
            except BaseException as exc:
                answer = b"1" + f"{type(exc).__name__}\n{_error_text(exc)}".encode()
            os.write(write_end, answer)
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        answer = pipe.read()
    _, status = os.waitpid(pid, 0)
    if answer[:1] == b"0" and os.waitstatus_to_exitcode(status) == 0:
        return ChildAnswer(answer[1:])
    kind, _, text = answer[1:].decode(errors="replace").partition("\n")
    if not answer:
        kind, text = "ChildDied", f"the child ended with status {os.waitstatus_to_exitcode(status)}"
    return ChildAnswer(text.encode(), error=kind)


def _error_text(exc: BaseException) -> str:
    """An exception as one line for a person: an OS error's reason and file, a tunehub error's
    message (``.message``), else its text."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    message = getattr(exc, "message", None)
    return str(message if isinstance(message, str) else exc)[:4000]


class UnixUsers:
    """Creates, finds and retires the system users of accounts."""

    def __init__(self, homes: Path, prefix: str = DEFAULT_PREFIX,
                 group: str = DEFAULT_GROUP) -> None:
        self.homes = Path(homes)
        self.prefix = prefix
        self.group = group

    @classmethod
    def from_env(cls, home: Path, environ: dict[str, str] | None = None) -> UnixUsers:
        """Homes under ``home/users``; prefix and group from the environment."""
        env = os.environ if environ is None else environ
        return cls(Path(home) / "users", env.get(ENV_PREFIX) or DEFAULT_PREFIX,
                   env.get(ENV_GROUP) or DEFAULT_GROUP)

    # --- names ---------------------------------------------------------------------------

    def login_name(self, account: str) -> str:
        """``prefix + account`` when that is a safe login; otherwise a sanitised, shortened
        name with a hash of the account, so two accounts never map to one login."""
        safe = _LOGIN_UNSAFE.sub("_", account.lower())
        name = self.prefix + safe
        if safe != account or len(name) > _MAX_LOGIN:
            digest = hashlib.sha256(account.encode()).hexdigest()[:6]
            name = f"{name[:_MAX_LOGIN - 7]}-{digest}"
        return name

    def home_of(self, account: str) -> Path:
        return self.homes / account

    # --- lookups -------------------------------------------------------------------------

    def lookup(self, account: str) -> UnixUser | None:
        """The account's system user, or ``None`` when it has none (or the name is taken by
        a user that is not ours: that one is never used)."""
        try:
            entry = pwd.getpwnam(self.login_name(account))
        except KeyError:
            return None
        if entry.pw_gecos != MARK + account or entry.pw_uid == 0:
            return None
        return UnixUser(account, entry.pw_name, entry.pw_uid, entry.pw_gid,
                        Path(entry.pw_dir), retired=entry.pw_shell == RETIRED_SHELL)

    def require(self, account: str) -> UnixUser:
        """The account's active system user, or :class:`UnixUserError` saying why not."""
        user = self.lookup(account)
        if user is None:
            raise UnixUserError(f"account {account!r} has no system user "
                                f"{self.login_name(account)!r} (tunehub runs nothing of a "
                                "person's as root)")
        if user.retired:
            raise UnixUserError(f"account {account!r} was deleted; its system user "
                                f"{user.login} is locked")
        return user

    def group_id(self) -> int:
        """The shared group (created on first use)."""
        try:
            return grp.getgrnam(self.group).gr_gid
        except KeyError:
            try:
                _run(["groupadd", "--system", self.group])
            except UnixUserError as exc:
                try:  # made meanwhile by another process?
                    return grp.getgrnam(self.group).gr_gid
                except KeyError:
                    raise exc from None
            return grp.getgrnam(self.group).gr_gid

    # --- changes -------------------------------------------------------------------------

    def ensure(self, account: str) -> UnixUser:
        """The account's system user, created (or re-enabled after a deletion) as needed, with
        its home. Refuses names that are not account names and logins owned by others."""
        if not _ACCOUNT_RE.match(account):
            raise UnixUserError(f"account {account!r}: not a valid account name for a system "
                                "user (1-32 of a-z 0-9 . _ -)")
        login = self.login_name(account)
        home = self.home_of(account)
        self.group_id()
        entry = _entry(login)
        if entry is None:
            try:
                _run(["useradd", "--system", "--user-group", "--groups", self.group,
                      "--home-dir", str(home), "--no-create-home", "--shell", LOGIN_SHELL,
                      "--comment", MARK + account, login])
            except UnixUserError:
                # Made meanwhile by another process for the same account (two logins at
                # once): that user is ours; anything else is the error it was.
                entry = _entry(login)
                if entry is None or entry.pw_gecos != MARK + account:
                    raise
            return self._ready(account)
        if entry.pw_gecos != MARK + account or entry.pw_uid == 0:
            raise UnixUserError(
                f"account {account!r}: the system user {login!r} already exists and is not "
                "tunehub's; rename or remove it (tunehub never reuses other users)")
        if entry.pw_shell == RETIRED_SHELL or entry.pw_dir != str(home):
            _run(["usermod", "--expiredate", "", "--shell", LOGIN_SHELL, "--home", str(home),
                  login])
        return self._ready(account)

    def _ready(self, account: str) -> UnixUser:
        user = self.lookup(account)
        if user is None:
            raise UnixUserError(f"account {account!r}: its system user vanished while made")
        self._make_home(user)
        return user

    def _make_home(self, user: UnixUser) -> None:
        self.homes.mkdir(parents=True, exist_ok=True)
        os.chmod(self.homes, 0o711)  # traversable, not listable: nobody sees who else is here
        try:
            os.mkdir(user.home, 0o700)
        except FileExistsError:
            if user.home.is_symlink() or not user.home.is_dir():
                raise UnixUserError(f"{user.home} is not a directory") from None
            return  # an existing home keeps its owner and modes
        os.chown(user.home, user.uid, user.gid)

    def retire(self, account: str) -> UnixUser | None:
        """Lock a deleted account's user and kill its processes; its files stay for an admin
        to archive (``tar`` the home, then ``userdel``)."""
        user = self.lookup(account)
        if user is None:
            return None
        _run(["usermod", "--expiredate", "1", "--shell", RETIRED_SHELL, user.login])
        kill_processes_of(user.uid)
        return user


def unreachable(readable: Sequence[Path], gid: int, passable: Sequence[Path] = ()) -> str | None:
    """The first path a member of group ``gid`` with no other rights (uid ``nobody``) cannot
    read (``readable``) or reach (``passable``), tried for real in a child process so ACLs
    count; ``None`` when all is well."""
    try:
        nobody = pwd.getpwnam("nobody").pw_uid
    except KeyError:
        nobody = 65534

    def drop() -> None:
        become(nobody, gid, [gid], "nobody")

    def work() -> bytes:
        for path, read in [*((p, True) for p in readable), *((p, False) for p in passable)]:
            try:
                if not read:
                    os.stat(path)
                elif path.is_dir():
                    os.listdir(path)
                else:
                    with open(path, "rb") as fh:
                        fh.read(1)
            except OSError as exc:
                return f"{path} ({exc.strerror}{_closed_dir(path)})".encode()
        return b""

    answer = answer_as(drop, work)
    if not answer.ok:
        return f"could not test as nobody: {answer.data.decode(errors='replace')}"
    return answer.data.decode(errors="replace") or None


def closed_ancestors(paths: Sequence[Path]) -> list[Path]:
    """The directories above ``paths`` (links resolved) that others cannot pass: a Python
    under ``/root/.pyenv`` or a checkout in a 0700 home keep everyone else's processes out."""
    closed = set()
    for path in paths:
        for parent in Path(os.path.realpath(path)).parents:
            try:
                if not parent.stat().st_mode & stat.S_IXOTH:
                    closed.add(parent)
            except OSError:
                continue
    return sorted(closed)


def grant_passage(gid: int, directories: Sequence[Path]) -> list[Path]:
    """Let group ``gid`` pass ``directories`` (an ACL entry, execute only: no listing, no
    reading); returns the directories it was granted on, to give back with
    :func:`revoke_passage`. Directories whose ACL cannot be changed are left out."""
    return [d for d in directories if _setfacl(d, "-m", f"g:{gid}:x")]


def revoke_passage(gid: int, directories: Sequence[Path]) -> None:
    """Take back what :func:`grant_passage` gave ``gid``, and only that.

    Why not put back the ACL as it was before the grant: several platforms (test suites) run
    at once on one machine, each granting its own group passage on the same directories
    (``/root`` for a Python under pyenv). A snapshot restored by one of them also erased the
    entries the others had added since, and their people's servers then failed to start
    ("Permission denied" running Python); it also brought back entries of groups already
    deleted, whose gid a new group may get."""
    for d in directories:
        _setfacl(d, "-x", f"g:{gid}")


def _setfacl(directory: Path, *change: str) -> bool:
    """``setfacl *change directory`` under the directory's ACL lock; False if it could not
    be changed (no ``setfacl``, a file system without ACLs, not ours)."""
    try:
        with _acl_lock(directory):
            subprocess.run(system_argv(["setfacl", *change, str(directory)]), capture_output=True,
                           check=True)
    except (OSError, subprocess.CalledProcessError):
        return False
    return True


@contextmanager
def _acl_lock(directory: Path) -> Iterator[None]:
    """Serialise our ACL edits of ``directory`` across processes: ``setfacl -m`` and ``-x``
    read, change and write the whole ACL, so two at once can lose one's change. The lock is
    an ``flock`` on the directory itself (no lock file to leave behind)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _closed_dir(path: Path) -> str:
    """Which directory on the way to ``path`` (links resolved) stops the caller, as text."""
    real = Path(os.path.realpath(path))
    for parent in reversed(real.parents):  # from / down
        try:
            os.stat(parent / real.relative_to(parent).parts[0])
        except OSError:
            return f"; {parent} is closed to others"
    return ""


def kill_processes_of(uid: int) -> list[int]:
    """SIGKILL every process whose real or effective uid is ``uid`` (never uid 0)."""
    if uid == 0:
        return []
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        uids = next((line.split()[1:3] for line in status.splitlines()
                     if line.startswith("Uid:")), [])
        if str(uid) in uids:
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
            except ProcessLookupError:
                pass
    return killed


# useradd/usermod/groupadd refuse at once ("cannot lock /etc/passwd; try again later") while
# another of them (two people logging in at the same moment, another tunehub, apt) holds the
# file's lock: they are tried again for this long.
PASSWD_LOCK_WAIT_SECONDS = 30.0


def _entry(login: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(login)
    except KeyError:
        return None


def _run(argv: list[str]) -> None:
    deadline = time.monotonic() + PASSWD_LOCK_WAIT_SECONDS
    delay = 0.05
    resolved = system_argv(argv)
    while True:
        try:
            subprocess.run(resolved, check=True, capture_output=True, text=True, timeout=60)
            return
        except FileNotFoundError:
            raise UnixUserError(f"{argv[0]} not found: system users need the passwd package "
                                "(useradd, usermod, groupadd)") from None
        except subprocess.CalledProcessError as exc:
            error = (exc.stderr or "").strip()
            if "cannot lock" in error and time.monotonic() < deadline:
                time.sleep(delay)  # back-off while another process holds /etc/passwd's lock
                delay = min(delay * 2, 1.0)
                continue
            raise UnixUserError(f"{' '.join(argv[:1])} {argv[-1]}: "
                                f"{error or exc.returncode}") from None
