"""Assembles the tornado application under a base path (``/`` standalone,
``/services/tuner/`` behind the hub).

Without a :class:`ServiceContext` only the trial report endpoint is served (the CLI's loopback
runtime); with one, the whole service (:mod:`tuner.api.routes`): REST API, OpenAPI, the sweeps
page, metrics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import tornado.web
from tornado.log import access_log

from tunehub_base.request_bounds import BoundedApplication, RequestLimits
from tuner.api.base import NotFoundHandler
from tuner.api.trials import GpuUseHandler, ReportHandler
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
        (rf"{base}api/v1/trials/([^/]+)/gpu-use", GpuUseHandler, {"engine": engine}),
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
    settings["log_function"] = log_request
    return BoundedApplication(routes, **settings)


def log_request(handler: tornado.web.RequestHandler) -> None:
    """Tornado's access log (info, warning for a 4xx, error for a 5xx), except that a 503
    (the database away: every call answers it until it is back, and :mod:`tuner.db.outage`
    has said so once) is a debug line, not an error per request."""
    status = handler.get_status()
    if status == 503:
        log = access_log.debug
    elif status < 400:
        log = access_log.info
    elif status < 500:
        log = access_log.warning
    else:
        log = access_log.error
    log("%d %s %.2fms", status, handler._request_summary(),
        1000.0 * handler.request.request_time())
