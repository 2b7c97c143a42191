"""Who is calling: JupyterHub tokens and the hub's OAuth cookie, checked with HubAuth, and
tunehub's custom scopes.

``custom:tuner:read`` lets a caller see their own sweeps and models, ``custom:tuner:submit``
lets them change them, ``custom:tuner:admin`` extends both to everyone's. The hub grants these
through roles and ``server_token_scopes``; the service only checks them.
"""

from __future__ import annotations

from typing import Any

from jupyterhub.services.auth import HubOAuth, HubOAuthenticated

from tuner.api.base import JsonHandler
from tuner.errors import Forbidden, Unauthorized
from tuner.sweeps import Actor

READ = "custom:tuner:read"
SUBMIT = "custom:tuner:submit"
ADMIN = "custom:tuner:admin"
SCOPES = {
    READ: "See your sweeps, trials and models in the tuner.",
    SUBMIT: "Submit, cancel and resume your sweeps; promote your models.",
    ADMIN: "See and change every user's sweeps and models.",
}


def has_scope(scopes: list[str], wanted: str) -> bool:
    return any(s == wanted or s.startswith(wanted + "!") for s in scopes)


class UserHandler(HubOAuthenticated, JsonHandler):
    """A handler for hub users: token (``Authorization: token ...``) or OAuth cookie."""

    def initialize(self, ctx: Any) -> None:
        self.ctx = ctx
        self.hub_auth = ctx.hub_auth

    @property
    def hub_scopes(self) -> None:  # type: ignore[override]
        # Any identified hub user passes the mixin; our scopes are checked per request so the
        # caller gets a JSON reason.
        return None

    def actor(self, scope: str = READ) -> Actor:
        user: dict[str, Any] | None = self.current_user  # type: ignore[assignment]
        if not user or user.get("kind", "user") != "user":
            raise Unauthorized("a JupyterHub user token or login is required")
        scopes = list(user.get("scopes") or [])
        admin = has_scope(scopes, ADMIN)
        if not admin and not has_scope(scopes, scope):
            raise Forbidden(f"this token lacks the scope {scope}")
        return Actor(name=user["name"], admin=admin)


def make_hub_auth() -> HubOAuth:
    """HubOAuth configured from the JUPYTERHUB_* variables the hub gives its services.

    It is the process's one instance (``HubOAuth.instance()``) because JupyterHub's
    ``HubOAuthCallbackHandler`` finds it that way, and the login state the sweeps page stores in
    it (the PKCE code verifier, kept in memory) must be there when the callback arrives."""
    return HubOAuth.instance(cache_max_age=60)
