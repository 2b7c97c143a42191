"""Local accounts: user names with scrypt-hashed passwords in one JSON file.

The embedded platform has no system users and no identity provider, yet logins must be real. This
file is the whole user database for :class:`hub.auth.TunehubAuthenticator`; ``tunehub up`` writes
the first admin account into it before the hub starts, so there is never a window in which
whoever reaches the login page first becomes admin. Passwords are never stored, only
``scrypt`` hashes (stdlib, memory-hard), and the file is readable by its owner only.

When ``tunehub up`` runs as root, every account also has a system user of its own
(:mod:`tunehub_base.unix_users`): made with the account, locked when it is deleted.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tunehub_base.unix_users import UnixUsers

# scrypt cost: ~16 MiB and a few tens of milliseconds per check.
_N, _R, _P = 2**14, 8, 1
USERNAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,31}$")


class AccountError(ValueError):
    """A request about accounts that cannot be honoured; the message is for the user."""


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=_N, r=_R, p=_P, dklen=32)
    b64 = base64.b64encode
    return f"scrypt${_N}${_R}${_P}${b64(salt).decode()}${b64(digest).decode()}"


def verify_password(password: str, stored: str) -> bool:
    try:
        kind, n, r, p, salt, digest = stored.split("$")
        if kind != "scrypt":
            return False
        expected = base64.b64decode(digest)
        actual = hashlib.scrypt(
            password.encode(), salt=base64.b64decode(salt), n=int(n), r=int(r), p=int(p),
            dklen=len(expected),
        )
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(actual, expected)


def random_password() -> str:
    """Readable and strong: 4 groups of 5 characters (~100 bits)."""
    alphabet = "abcdefghjkmnpqrstuvwxyz23456789"
    return "-".join("".join(secrets.choice(alphabet) for _ in range(5)) for _ in range(4))


def check_username(name: str) -> str:
    if not USERNAME_RE.match(name):
        raise AccountError(
            f"username {name!r}: use 1-32 lowercase letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


@dataclass(frozen=True)
class Account:
    name: str
    admin: bool
    password_hash: str | None
    created_at: str

    @property
    def can_log_in(self) -> bool:
        return bool(self.password_hash)


class AccountStore:
    """The accounts file. Every change is a locked read-modify-write with an atomic replace,
    so ``tunehub up`` and a running hub never lose each other's writes."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    # --- reading ---------------------------------------------------------------------------

    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, json.JSONDecodeError) as exc:
            raise AccountError(f"cannot read the accounts file {self.path}: {exc}") from None
        users = data.get("users", {})
        return users if isinstance(users, dict) else {}

    def get(self, name: str) -> Account | None:
        entry = self._read().get(name)
        if entry is None:
            return None
        return _account(name, entry)

    def all(self) -> list[Account]:
        return [_account(name, entry) for name, entry in sorted(self._read().items())]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._read()

    def has_admin(self) -> bool:
        return any(a.admin and a.can_log_in for a in self.all())

    def verify(self, name: str, password: str) -> Account | None:
        """The account if ``password`` is right, else ``None`` (same cost either way)."""
        account = self.get(name)
        stored = account.password_hash if account and account.password_hash else None
        ok = verify_password(password, stored or _DUMMY_HASH)
        return account if ok and stored else None

    # --- writing ---------------------------------------------------------------------------

    @contextmanager
    def _editing(self) -> Iterator[dict[str, dict[str, Any]]]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.path.with_name(self.path.name + ".lock")
        with open(lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            users = self._read()
            yield users
            tmp = self.path.with_name(self.path.name + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                json.dump({"version": 1, "users": users}, fh, indent=1, sort_keys=True)
            os.replace(tmp, self.path)

    def create(self, name: str, password: str | None, admin: bool = False) -> Account:
        """A new account; ``password=None`` makes one that cannot log in until an admin sets a
        password (what the hub's admin panel creates)."""
        check_username(name)
        with self._editing() as users:
            if name in users:
                raise AccountError(f"username {name!r}: an account with this name exists")
            users[name] = {
                "admin": admin,
                "password": hash_password(password) if password else None,
                "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            }
            return _account(name, users[name])

    def set_password(self, name: str, password: str) -> None:
        with self._editing() as users:
            if name not in users:
                raise AccountError(f"username {name!r}: no such account")
            users[name]["password"] = hash_password(password)

    def set_admin(self, name: str, admin: bool) -> None:
        with self._editing() as users:
            if name in users:
                users[name]["admin"] = admin

    def delete(self, name: str) -> None:
        with self._editing() as users:
            users.pop(name, None)


def _account(name: str, entry: dict[str, Any]) -> Account:
    return Account(
        name=name,
        admin=bool(entry.get("admin")),
        password_hash=entry.get("password") or None,
        created_at=str(entry.get("created_at", "")),
    )


_DUMMY_HASH = hash_password(secrets.token_hex(8))


# --- system users (tunehub up as root) ------------------------------------------------------


def system_users() -> UnixUsers | None:
    """The system users of accounts when isolation is on (``TUNEHUB_UNIX_USERS=1`` and root),
    else ``None``: every server and trial then runs as the hub's user."""
    from tunehub_base import unix_users
    from tunehub_base.settings import load_settings

    if not unix_users.enabled():
        return None
    return unix_users.UnixUsers.from_env(load_settings().home)


def provision_system_user(name: str) -> None:
    """Give account ``name`` its system user and home now (isolation on), and its area of the
    data store (``users/<name>``, :mod:`tunehub_base.datastore`) on one machine: made by the
    platform with the account, so nobody can have made it for them. Raises
    :class:`AccountError` with the reason when that is refused (e.g. the login is taken)."""
    from tunehub_base import datastore
    from tunehub_base.settings import load_settings
    from tunehub_base.unix_users import UnixUserError

    users = system_users()
    try:
        user = users.ensure(name) if users is not None else None
        if datastore.platform_makes_areas():
            uid, gid = (user.uid, user.gid) if user else (os.geteuid(), os.getegid())
            datastore.ensure_area(load_settings(), name, uid, gid)
    except (UnixUserError, datastore.DataStoreError) as exc:
        raise AccountError(str(exc)) from None
    except OSError as exc:  # e.g. users/ made by another Unix user than the hub's (no root)
        raise AccountError(f"account {name!r}: its area of the data store: {exc}") from None


def retire_system_user(name: str) -> None:
    """A deleted account: its processes (notebook, kernels, trials) are killed and its system
    user locked; the home stays for an admin to archive."""
    users = system_users()
    if users is not None:
        users.retire(name)
