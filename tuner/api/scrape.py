"""The tuner service's Prometheus endpoint, ``/services/tuner/metrics``: for a hub token with
the hub's own metrics scope only.

Why a token: the figures (sweeps and trials by state, request latencies by route) say what
everyone on the platform is doing and when; anonymous, anyone who can reach the proxy read them.
Why the hub's ``read:metrics`` scope (``TUNEHUB_METRICS_SCOPE``) rather than a secret of our own:
JupyterHub's own ``/hub/metrics`` asks for it, so one service token in the scrape config (the
README shows one) reads both, and revoking it in the hub stops both."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tunehub_base.options import setting
from tuner.api.base import JsonHandler
from tuner.errors import Forbidden, Unauthorized

if TYPE_CHECKING:
    from tuner.api.context import ServiceContext


class MetricsRoute(JsonHandler):
    def initialize(self, ctx: ServiceContext) -> None:
        self.ctx = ctx

    async def get(self) -> None:
        scope = setting("TUNEHUB_METRICS_SCOPE").text()
        model = await self.ctx.hub_auth.get_user(self, sync=False)
        if not model:
            raise Unauthorized(f"a hub token with the scope {scope} is required "
                               "(Authorization: Bearer ...)")
        if scope not in (model.get("scopes") or []):
            raise Forbidden(f"this token lacks the scope {scope}")
        if self.ctx.pool_metrics is not None:
            await self.ctx.pool_metrics.refresh()  # the queue (or the cluster) read first
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(generate_latest())
