"""Who is calling: JupyterHub tokens and the hub's OAuth cookie, checked with HubAuth, and
tunehub's custom scopes (named in :mod:`tunehub_base.scopes`).

``custom:tuner:read`` lets a caller see their own sweeps and models, ``custom:tuner:submit``
lets them change them, ``custom:tuner:admin`` extends both to everyone's, and
``custom:tuner:priority-high`` lets them submit ``priority: high`` sweeps. The hub grants these
through roles and ``server_token_scopes``; the service only checks them.

Every handler of a hub user identifies the caller in :meth:`UserHandler.prepare`, before its
method runs (and so before any effect): a request without a user is a 401, a token without the
method's scope a 403. What the caller may do with a named object is decided next, in
:mod:`tuner.api.access`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, TypedDict

from jupyterhub.services.auth import HubOAuth, HubOAuthenticated, UserNotAllowed

from tunehub_base.scopes import ADMIN, HIGH_PRIORITY, READ, SUBMIT
from tuner.api.base import JsonHandler
from tuner.errors import Forbidden, Unauthorized
from tuner.sweep_store import Actor

if TYPE_CHECKING:
    from tuner.api.context import ServiceContext


class _HubIdentity(TypedDict):
    name: str


class HubUser(_HubIdentity, total=False):
    """The identity model the hub answers for a token or login cookie (its ``GET /api/user``),
    as far as the service reads it. ``kind`` is ``user`` or ``service``; ``scopes`` are the
    token's, already expanded by the hub."""

    kind: str
    scopes: list[str]


def has_scope(scopes: list[str], wanted: str, user: str) -> bool:
    """``wanted`` held unfiltered, or filtered to the caller themself (``!user=<name>``).

    Any other filter (``custom:tuner:admin!user=bob``) grants nothing: our scopes are about
    the caller's own objects, and the admin scope only means something unfiltered."""
    return any(s == wanted or s == f"{wanted}!user={user}" for s in scopes)


class UserHandler(HubOAuthenticated, JsonHandler):
    """A handler for hub users: token (``Authorization: token ...``) or OAuth cookie.

    ``scopes`` maps each HTTP method to the scope it needs; :meth:`prepare` checks it before
    the method runs, asking the hub without blocking the event loop."""

    scopes: ClassVar[dict[str, str]] = {"GET": READ, "POST": SUBMIT}

    def initialize(self, ctx: ServiceContext) -> None:
        self.ctx = ctx
        self.hub_auth = ctx.hub_auth

    @property
    def hub_scopes(self) -> None:
        # Any identified hub user passes the mixin; our scopes are checked in prepare so the
        # caller gets a JSON reason.
        return None

    async def prepare(self) -> None:
        # HubAuth's synchronous get_user would block the loop on a round trip to the hub.
        model: HubUser | None = await self.hub_auth.get_user(self, sync=False)
        user: HubUser | None = None
        if model:
            try:
                user = self.check_hub_user(model)
            except UserNotAllowed:
                user = None
        self._hub_auth_user_cache = user
        self.current_user = user
        self.actor = self._actor(self.scopes.get(self.request.method or "GET", READ))

    def _actor(self, scope: str) -> Actor:
        user: HubUser | None = self.current_user
        if not user or user.get("kind", "user") != "user":
            raise Unauthorized("a JupyterHub user token or login is required")
        name = str(user["name"])
        scopes = list(user.get("scopes") or [])
        admin = has_scope(scopes, ADMIN, name)
        if not admin and not has_scope(scopes, scope, name):
            raise Forbidden(f"this token lacks the scope {scope}")
        return Actor(
            name=name, admin=admin, high_priority=admin or has_scope(scopes, HIGH_PRIORITY, name)
        )


def make_hub_auth() -> HubOAuth:
    """HubOAuth configured from the JUPYTERHUB_* variables the hub gives its services.

    It is the process's one instance (``HubOAuth.instance()``) because JupyterHub's
    ``HubOAuthCallbackHandler`` finds it that way, and the login state the sweeps page stores in
    it (the PKCE code verifier, kept in memory) must be there when the callback arrives."""
    return HubOAuth.instance(cache_max_age=60)
