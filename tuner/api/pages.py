"""The sweeps page, behind the hub's login (OAuth)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from jupyterhub.services.auth import HubOAuthenticated
from tornado.web import RequestHandler, authenticated

if TYPE_CHECKING:
    from tuner.api.context import ServiceContext


class IndexHandler(HubOAuthenticated, RequestHandler):
    def initialize(self, ctx: ServiceContext, web_dir: Path) -> None:
        self.hub_auth = ctx.hub_auth
        self.web_dir = web_dir

    @property
    def hub_scopes(self) -> None:
        return None

    @authenticated
    def get(self) -> None:
        index = self.web_dir / "index.html"
        if not index.exists():
            self.set_status(503)
            self.finish("the sweeps page is not installed")
            return
        self.set_header("Content-Type", "text/html; charset=utf-8")
        # The page's script sends this token with its API requests: JupyterHub accepts the
        # login cookie of a script (non-navigation) request only with it.
        xsrf = self.xsrf_token
        self.finish(index.read_bytes().replace(
            b"{{xsrf_token}}", xsrf if isinstance(xsrf, bytes) else xsrf.encode()))
