"""Logins for the embedded platform: per-user accounts with hashed passwords, no system users.

Why not the alternatives: ``DummyAuthenticator`` lets anyone in; ``SharedPasswordAuthenticator``
gives the whole team one password; ``PAMAuthenticator`` needs a system user per person. Here each
person has an account in :class:`tunehub_base.accounts.AccountStore`; admins create accounts and
reset passwords on the hub page ``/hub/tunehub/accounts`` (the new password is shown once), and
every user can change their own password at ``/hub/tunehub/password``.

Why ours and not ``jupyterhub-nativeauthenticator`` (NativeAuthenticator), which does the same
in outline (sign-up, hashed passwords, admin authorisation): its accounts live in the hub's own
database, and ``tunehub up`` creates the first admin, and provisions every account's Unix user,
before the hub runs, from a file it can read without loading JupyterHub
(:class:`tunehub_base.accounts.AccountStore`); an account here is also what makes the person's
system user (:func:`tunehub_base.accounts.provision_system_user`) when the hub runs as root. It
is not a dependency of tunehub either; adopting it would add one and split accounts between two
stores. Kubernetes mode can use any OAuthenticator instead (:mod:`hub.kube_logins`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from jupyterhub.auth import Authenticator
from traitlets import Integer, Unicode, default

from hub.login_throttle import LoginThrottle, client_address
from tunehub_base.accounts import (
    AccountError,
    AccountStore,
    provision_system_user,
    retire_system_user,
)


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
        help="""Failed logins for one account from one client address before that address is
        locked out of that account for ``lockout_seconds`` (slows down password guessing; the
        account's owner still logs in from their own address: see hub/login_throttle.py).""",
    ).tag(config=True)

    lockout_seconds = Integer(
        60, help="""How long the first lockout of an (account, client address) lasts; each
        further lockout of the same pair lasts twice the one before, up to
        ``max_lockout_seconds``."""
    ).tag(config=True)

    max_lockout_seconds = Integer(
        3600, help="The longest lockout of an (account, client address)."
    ).tag(config=True)

    @default("accounts_file")
    def _default_accounts_file(self) -> str:
        from tunehub_base.settings import load_settings

        return str(load_settings().home / "hub" / "accounts.json")

    @default("any_allow_config")
    def _default_any_allow_config(self) -> bool:
        # Having an account is the allow rule (see check_allowed).
        return True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.throttle = LoginThrottle(self.max_failed_logins, self.lockout_seconds,
                                      self.max_lockout_seconds)

    @property
    def store(self) -> AccountStore:
        return AccountStore(Path(self.accounts_file))

    async def authenticate(self, handler: Any, data: dict[str, str]) -> dict[str, Any] | None:
        username = self.normalize_username(data.get("username", "").strip())
        password = data.get("password", "")
        if not username or not password:
            return None
        client = client_address(handler.request,
                                getattr(self.parent, "trusted_downstream_ips", None) or ())
        if (wait := self.throttle.locked_for(username, client)) > 0:
            self.log.warning("login for %r from %s refused for %.0f s more: too many failed "
                             "attempts from there", username, client, wait)
            return None
        try:
            account = await asyncio.to_thread(self.store.verify, username, password)
        except AccountError as exc:
            self.log.error("%s", exc)
            return None
        if account is None:
            self.throttle.failed(username, client)
            self.log.warning("failed login for %r from %s", username, client)
            return None
        self.throttle.succeeded(username, client)
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
