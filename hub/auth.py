"""Logins for the embedded platform: per-user accounts with hashed passwords, no system users.

Why not the alternatives: ``DummyAuthenticator`` lets anyone in; ``SharedPasswordAuthenticator``
gives the whole team one password; ``PAMAuthenticator`` needs a system user per person. Here each
person has an account in :class:`hub.accounts.AccountStore`; admins create accounts and reset
passwords on the hub page ``/hub/tunehub/accounts`` (the new password is shown once), and every
user can change their own password at ``/hub/tunehub/password``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from jupyterhub.auth import Authenticator
from traitlets import Integer, Unicode, default

from hub.accounts import AccountError, AccountStore, provision_system_user, retire_system_user


class TunehubAuthenticator(Authenticator):
    """Username + password checked against the accounts file."""

    accounts_file = Unicode(
        help="""Path of the accounts file (JSON with scrypt hashes, mode 0600).

        Defaults to ``$TUNEHUB_HOME/hub/accounts.json``; ``tunehub up`` creates the first admin
        account in it.""",
    ).tag(config=True)

    min_password_length = Integer(
        10, help="Shortest password a user may choose on the change-password page."
    ).tag(config=True)

    max_failed_logins = Integer(
        5,
        help="""Failed logins for one username before further attempts for that name are
        refused for ``lockout_seconds`` (slows down password guessing).""",
    ).tag(config=True)

    lockout_seconds = Integer(
        60, help="How long a username is locked after ``max_failed_logins`` failures."
    ).tag(config=True)

    @default("accounts_file")
    def _default_accounts_file(self) -> str:
        from tuner.settings import load_settings

        return str(load_settings().home / "hub" / "accounts.json")

    @default("any_allow_config")
    def _default_any_allow_config(self) -> bool:
        # Having an account is the allow rule (see check_allowed).
        return True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._failures: dict[str, tuple[int, float]] = {}

    @property
    def store(self) -> AccountStore:
        return AccountStore(Path(self.accounts_file))

    def _locked(self, username: str) -> bool:
        count, since = self._failures.get(username, (0, 0.0))
        if count < self.max_failed_logins:
            return False
        if time.monotonic() - since > self.lockout_seconds:
            self._failures.pop(username, None)
            return False
        return True

    def _record_failure(self, username: str) -> None:
        count, _ = self._failures.get(username, (0, 0.0))
        self._failures[username] = (count + 1, time.monotonic())

    async def authenticate(self, handler: Any, data: dict[str, str]) -> dict[str, Any] | None:
        username = self.normalize_username(data.get("username", "").strip())
        password = data.get("password", "")
        if not username or not password:
            return None
        if self._locked(username):
            self.log.warning("login for %r refused: too many failed attempts", username)
            return None
        try:
            account = await asyncio.to_thread(self.store.verify, username, password)
        except AccountError as exc:
            self.log.error("%s", exc)
            return None
        if account is None:
            self._record_failure(username)
            self.log.warning("failed login for %r", username)
            return None
        self._failures.pop(username, None)
        model: dict[str, Any] = {"name": account.name}
        if account.admin:
            # Bootstrap admins stay admins; others keep what the admin panel gave them.
            model["admin"] = True
        return model

    def check_allowed(self, username: str, authentication: dict[str, Any] | None = None) -> bool:
        return username in self.store

    def add_user(self, user: Any) -> None:
        """A user added in the admin panel gets an account without a password: it can log in
        once an admin sets one on the accounts page."""
        super().add_user(user)
        if user.name not in self.store:
            try:
                self.store.create(user.name, None)
            except AccountError as exc:
                self.log.warning("no account for hub user %s: %s", user.name, exc)
                return
        try:
            provision_system_user(user.name)
        except AccountError as exc:
            self.log.error("hub user %s: %s", user.name, exc)

    def delete_user(self, user: Any) -> None:
        """The hub has stopped the user's servers; their trials and anything else running as
        their system user are killed, and their files are left for an admin to archive."""
        super().delete_user(user)
        self.store.delete(user.name)
        retire_system_user(user.name)

    def get_handlers(self, app: Any) -> list[tuple[str, Any]]:
        from hub.account_pages import AccountsHandler, PasswordHandler

        return [*super().get_handlers(app),
                ("/tunehub/accounts", AccountsHandler),
                ("/tunehub/password", PasswordHandler)]
