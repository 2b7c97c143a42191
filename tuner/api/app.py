"""Assembles the tornado application under a base path (``/`` standalone,
``/services/tuner/`` behind the hub).

Without a :class:`ServiceContext` only the trial report endpoint is served (the CLI's loopback
runtime); with one, the whole service: REST API, OpenAPI, the sweeps page, metrics.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tornado.web
from jupyterhub.services.auth import HubOAuthCallbackHandler
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tuner.api.context import ServiceContext
from tuner.api.models import ModelHandler, ModelsHandler, PromoteHandler
from tuner.api.openapi import OpenApiHandler
from tuner.api.pages import IndexHandler
from tuner.api.sweeps import (
    SweepCancelHandler,
    SweepHandler,
    SweepResumeHandler,
    SweepsHandler,
    TrialLogHandler,
    TrialsHandler,
)
from tuner.api.trials import ReportHandler
from tuner.controller import Engine

WEB_DIR = Path(__file__).resolve().parent.parent / "web"


class MetricsHandler(tornado.web.RequestHandler):
    """Prometheus scrape endpoint (no user data, no auth)."""

    def get(self) -> None:
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(generate_latest())


def _plotly_js_dir() -> str:
    import plotly

    return str(Path(plotly.__file__).parent / "package_data")


def make_app(
    engine: Engine,
    base_path: str = "/",
    ctx: ServiceContext | None = None,
    cookie_secret: bytes | None = None,
) -> tornado.web.Application:
    base = "/" + base_path.strip("/") + "/" if base_path.strip("/") else "/"
    routes: list[Any] = [
        (rf"{base}api/v1/trials/(\d+)/report", ReportHandler, {"engine": engine}),
    ]
    settings: dict[str, Any] = {}
    if ctx is not None:
        c = {"ctx": ctx}
        routes += [
            (rf"{base}api/v1/sweeps", SweepsHandler, c),
            (rf"{base}api/v1/sweeps/(\d+)", SweepHandler, c),
            (rf"{base}api/v1/sweeps/(\d+)/cancel", SweepCancelHandler, c),
            (rf"{base}api/v1/sweeps/(\d+)/resume", SweepResumeHandler, c),
            (rf"{base}api/v1/sweeps/(\d+)/trials", TrialsHandler, c),
            (rf"{base}api/v1/sweeps/(\d+)/trials/(\d+)/logs", TrialLogHandler, c),
            (rf"{base}api/v1/models", ModelsHandler, c),
            (rf"{base}api/v1/models/([a-z0-9-]+)", ModelHandler, c),
            (rf"{base}api/v1/models/([a-z0-9-]+)/versions/(\d+)/promote", PromoteHandler, c),
            (rf"{base}api/v1/openapi.json", OpenApiHandler, {"base_path": base}),
            (rf"{base}metrics", MetricsHandler),
            (rf"{base}oauth_callback", HubOAuthCallbackHandler),
            (rf"{base}static/vendor/(plotly\.min\.js)", tornado.web.StaticFileHandler,
             {"path": _plotly_js_dir()}),
            (rf"{base}static/(.*)", tornado.web.StaticFileHandler, {"path": str(WEB_DIR)}),
            (rf"{base}?", IndexHandler, {"ctx": ctx, "web_dir": WEB_DIR}),
        ]
        settings["hub_auth"] = ctx.hub_auth
        settings["cookie_secret"] = cookie_secret
    return tornado.web.Application(routes, **settings)
