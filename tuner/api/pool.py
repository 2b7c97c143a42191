"""The GPU pool over REST: ``GET pool`` (each GPU, who holds it, since when; the queue with
positions and reasons; each person's share), ``GET usage?since=`` (allocated GPU-hours per
person, group, sweep and notebook), and ``POST``/``DELETE pool/requests``, where the hub's
spawner queues a notebook for GPUs.

``pool`` and ``usage`` are readable by every logged-in person with the tuner's read scope: who
holds what, and who waits, is public inside the lab (the point is that nobody has to shout
across the office). They only read; any other method is a 405, before anything happens.

``pool/requests`` is service to service: only the hub's spawner, with the secret it shares with
the tuner (:mod:`tunehub_base.pool_secret`), checked before anything happens; a person's token
is refused (401), because a queued notebook may stop other people's trials."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from tunehub_base import pool_secret
from tunehub_base.scopes import READ
from tuner.api.auth import UserHandler
from tuner.api.base import ApiError, JsonHandler
from tuner.api.context import ServiceContext
from tuner.pool_sources import LocalPoolSource, PoolSource
from tuner.pool_view import parse_since
from tuner.scheduling.gpu_queue import NotebookAsk

NAME_MAX = 255
GROUPS_MAX = 256


def pool_source(ctx: ServiceContext) -> PoolSource:
    """The service's source of the pool: the cluster's, or this machine's by default."""
    return ctx.pool_source or LocalPoolSource(ctx.store.settings.gpu_locks_dir, ctx.gpu_queue)


class PoolHandler(UserHandler):
    scopes: ClassVar[dict[str, str]] = {"GET": READ}

    async def get(self) -> None:
        self.send(await pool_source(self.ctx).pool())


class UsageHandler(UserHandler):
    scopes: ClassVar[dict[str, str]] = {"GET": READ}

    async def get(self) -> None:
        raw = self.get_query_argument("since", None)
        if not raw:
            raise ApiError(400, "since: expected a date like 2026-11-01", "since")
        since = parse_since(raw[:64])
        self.send(await pool_source(self.ctx).usage(since))


class PoolRequestsHandler(JsonHandler):
    """``POST``: queue (or keep queued) a notebook's ask for GPUs; the answer says whether to
    take them now, else its position and why it waits (the trials being preempted for it).
    ``DELETE ?person=&server=``: it got them, or gave up."""

    def initialize(self, ctx: ServiceContext) -> None:
        self.ctx = ctx

    async def prepare(self) -> None:
        header = self.request.headers.get("Authorization", "")
        scheme, _, offered = header.partition(" ")
        lock_dir = self.ctx.store.settings.gpu_locks_dir
        if scheme.lower() != "token" or not await asyncio.to_thread(
                pool_secret.matches, offered.strip(), lock_dir):
            raise ApiError(401, "only the hub's spawner may queue notebooks for GPUs")
        if self.ctx.gpu_queue is None:
            raise ApiError(409, "this tuner runs no local GPU pool (the local backend is off)")

    async def post(self) -> None:
        assert self.ctx.gpu_queue is not None
        body = self.json_body()
        gpus = body.get("gpus")
        total = len(self.ctx.gpu_queue.backend.gpus.gpu_ids)
        if isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= total:
            raise ApiError(400, f"gpus: a whole number from 1 to {total}, the pool's size", "gpus")
        groups = body.get("groups", [])
        if (not isinstance(groups, list) or len(groups) > GROUPS_MAX
                or not all(isinstance(g, str) and 0 < len(g) <= NAME_MAX for g in groups)):
            raise ApiError(400, "groups: a list of hub group names", "groups")
        ask = NotebookAsk(_name(body, "person", empty=False), _name(body, "server"),
                          tuple(groups), gpus)
        answer = await self.ctx.gpu_queue.ask(ask)
        self.send(answer.to_json())

    async def delete(self) -> None:
        assert self.ctx.gpu_queue is not None
        query = {k: self.get_query_argument(k, "") for k in ("person", "server")}
        person, server = _name(query, "person", empty=False), _name(query, "server")
        self.send({"withdrawn": self.ctx.gpu_queue.withdraw(person, server)})


def _name(body: dict[str, Any], key: str, empty: bool = True) -> str:
    value = body.get(key, "")
    if not isinstance(value, str) or len(value) > NAME_MAX or (not empty and not value):
        raise ApiError(400, f"{key}: a name of at most {NAME_MAX} characters", key)
    return value
