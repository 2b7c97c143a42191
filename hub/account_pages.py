"""Hub pages for the local accounts: admins create accounts and reset passwords, everyone changes
their own password. Served by the hub itself (``Authenticator.get_handlers``), so they share its
login, XSRF protection and look."""

from __future__ import annotations

import asyncio
from typing import Any

from jupyterhub.handlers import BaseHandler
from tornado import web

from tunehub_base.accounts import AccountError, AccountStore, provision_system_user, random_password


class _AccountsBase(BaseHandler):
    @property
    def store(self) -> AccountStore:
        return self.authenticator.store


class AccountsHandler(_AccountsBase):
    """``/hub/tunehub/accounts``: the admin's list of accounts."""

    def _require_admin(self) -> None:
        if "admin:users" not in self.parsed_scopes:
            raise web.HTTPError(403, "only admins can manage accounts")

    async def _page(self, **ns: Any) -> None:
        html = await self.render_template(
            "tunehub-accounts.html", accounts=self.store.all(), **ns
        )
        self.finish(html)

    @web.authenticated
    async def get(self) -> None:
        self._require_admin()
        await self._page()

    @web.authenticated
    async def post(self) -> None:
        self._require_admin()
        action = self.get_body_argument("action", "")
        name = self.get_body_argument("username", "").strip().lower()
        password = random_password()
        try:
            if action == "create":
                admin = self.get_body_argument("admin", "") == "on"
                await asyncio.to_thread(self.store.create, name, password, admin)
                try:  # its system user now, not at first spawn (tunehub up as root)
                    await asyncio.to_thread(provision_system_user, name)
                except AccountError:
                    await asyncio.to_thread(self.store.delete, name)
                    raise
                # A hub user too, so the admin panel lists them before their first login.
                self.user_from_username(name)
            elif action == "reset":
                await asyncio.to_thread(self.store.set_password, name, password)
            else:
                raise AccountError(f"action {action!r}: expected create or reset")
        except AccountError as exc:
            self.set_status(400)
            await self._page(error=str(exc))
            return
        self.log.info("%s: %s by %s", action, name, self.current_user.name)
        await self._page(new_login={"username": name, "password": password})


class PasswordHandler(_AccountsBase):
    """``/hub/tunehub/password``: change your own password."""

    @web.authenticated
    async def get(self) -> None:
        self.finish(await self.render_template("tunehub-password.html"))

    @web.authenticated
    async def post(self) -> None:
        name = self.current_user.name
        current = self.get_body_argument("current", "")
        new = self.get_body_argument("new", "")
        confirm = self.get_body_argument("confirm", "")
        minimum = self.authenticator.min_password_length
        error = None
        if await asyncio.to_thread(self.store.verify, name, current) is None:
            error = "current password: not correct"
        elif len(new) < minimum:
            error = f"new password: use at least {minimum} characters"
        elif new != confirm:
            error = "confirm: does not match the new password"
        if error:
            self.set_status(400)
            self.finish(await self.render_template("tunehub-password.html", error=error))
            return
        await asyncio.to_thread(self.store.set_password, name, new)
        self.finish(await self.render_template("tunehub-password.html", changed=True))
