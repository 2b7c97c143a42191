"""Assembles the tornado application under a base path (``/`` standalone,
``/services/tuner/`` behind the hub).

Without a :class:`ServiceContext` only the trial report endpoint is served (the CLI's loopback
runtime); with one, the whole service (:mod:`tuner.api.routes`): REST API, OpenAPI, the sweeps
page, metrics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import tornado.web

from tunehub_base.request_bounds import BoundedApplication, RequestLimits
from tuner.api.base import NotFoundHandler
from tuner.api.trials import ReportHandler
from tuner.scheduling.host import SweepHost

if TYPE_CHECKING:
    from tuner.api.context import ServiceContext


def make_app(
    engine: SweepHost,
    base_path: str = "/",
    ctx: ServiceContext | None = None,
    cookie_secret: bytes | None = None,
    limits: RequestLimits | None = None,
) -> tornado.web.Application:
    base = "/" + base_path.strip("/") + "/" if base_path.strip("/") else "/"
    routes: list[Any] = [
        (rf"{base}api/v1/trials/([^/]+)/report", ReportHandler, {"engine": engine}),
    ]
    # Every body is bounded before any route sees it (tunehub_base.request_bounds).
    settings: dict[str, Any] = {"request_limits": limits or RequestLimits.from_env()}
    if ctx is not None:
        # Imported here: the service's routes need JupyterHub, the CLI's report endpoint not.
        from tuner.api.routes import service_routes

        routes += service_routes(base, ctx)
        settings["hub_auth"] = ctx.hub_auth
        settings["cookie_secret"] = cookie_secret
    # Any other path: a JSON 404 like every API error, not tornado's HTML page.
    settings["default_handler_class"] = NotFoundHandler
    return BoundedApplication(routes, **settings)
