"""The tuner service's routes: REST API, OpenAPI, the sweeps page, metrics and the hub's OAuth
callback. Kept apart from :mod:`tuner.api.app` because they need JupyterHub (the ``hub``
extra), which the CLI's loopback report endpoint does not: ``pip install tunehub`` alone runs
sweeps from the command line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tornado.web
from jupyterhub.services.auth import HubOAuthCallbackHandler

from tuner.api.context import ServiceContext
from tuner.api.models import ModelHandler, ModelsHandler, PromoteHandler
from tuner.api.openapi import OpenApiHandler
from tuner.api.pages import IndexHandler
from tuner.api.pool import PoolHandler, PoolRequestsHandler, UsageHandler
from tuner.api.scrape import MetricsRoute
from tuner.api.sweeps import (
    SweepCancelHandler,
    SweepHandler,
    SweepResumeHandler,
    SweepsHandler,
    TrialLogHandler,
    TrialsHandler,
)

WEB_DIR = Path(__file__).resolve().parent.parent / "web"


def _plotly_js_dir() -> str:
    import plotly

    return str(Path(plotly.__file__).parent / "package_data")


def service_routes(base: str, ctx: ServiceContext) -> list[Any]:
    c = {"ctx": ctx}
    return [
        (rf"{base}api/v1/sweeps", SweepsHandler, c),
        (rf"{base}api/v1/sweeps/([^/]+)", SweepHandler, c),
        (rf"{base}api/v1/sweeps/([^/]+)/cancel", SweepCancelHandler, c),
        (rf"{base}api/v1/sweeps/([^/]+)/resume", SweepResumeHandler, c),
        (rf"{base}api/v1/sweeps/([^/]+)/trials", TrialsHandler, c),
        (rf"{base}api/v1/sweeps/([^/]+)/trials/([^/]+)/logs", TrialLogHandler, c),
        (rf"{base}api/v1/models", ModelsHandler, c),
        (rf"{base}api/v1/models/([^/]+)", ModelHandler, c),
        (rf"{base}api/v1/models/([^/]+)/versions/([^/]+)/promote", PromoteHandler, c),
        (rf"{base}api/v1/pool", PoolHandler, c),
        (rf"{base}api/v1/pool/requests", PoolRequestsHandler, c),
        (rf"{base}api/v1/usage", UsageHandler, c),
        (rf"{base}api/v1/openapi.json", OpenApiHandler, {"base_path": base}),
        (rf"{base}metrics", MetricsRoute, c),
        (rf"{base}oauth_callback", HubOAuthCallbackHandler),
        (rf"{base}static/vendor/(plotly\.min\.js)", tornado.web.StaticFileHandler,
         {"path": _plotly_js_dir()}),
        (rf"{base}static/(.*)", tornado.web.StaticFileHandler, {"path": str(WEB_DIR)}),
        (rf"{base}?", IndexHandler, {"ctx": ctx, "web_dir": WEB_DIR}),
    ]
