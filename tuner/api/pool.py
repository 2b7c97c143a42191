"""The GPU pool over REST: ``GET pool`` (each GPU, who holds it, since when) and
``GET usage?since=`` (allocated GPU-hours per person, group, sweep and notebook).

Readable by every logged-in person with the tuner's read scope: who holds what is public inside
the lab (the point is that nobody has to shout across the office). Both routes only read; any
other method is a 405, before anything happens."""

from __future__ import annotations

import asyncio
from typing import ClassVar

from tunehub_base.scopes import READ
from tuner.api.auth import UserHandler
from tuner.api.base import ApiError
from tuner.pool_view import parse_since, pool_view, usage_view


class PoolHandler(UserHandler):
    scopes: ClassVar[dict[str, str]] = {"GET": READ}

    async def get(self) -> None:
        lock_dir = self.ctx.store.settings.gpu_locks_dir
        self.send(await asyncio.to_thread(pool_view, lock_dir))


class UsageHandler(UserHandler):
    scopes: ClassVar[dict[str, str]] = {"GET": READ}

    async def get(self) -> None:
        raw = self.get_query_argument("since", None)
        if not raw:
            raise ApiError(400, "since: expected a date like 2026-11-01", "since")
        since = parse_since(raw[:64])
        lock_dir = self.ctx.store.settings.gpu_locks_dir
        self.send(await asyncio.to_thread(usage_view, lock_dir, since))
