"""The harness's own API client: plain JSON over real HTTP to the emulator, identified by its
User-Agent so the emulator counts its requests apart from the code under test, and
authenticated as a cluster admin (the controllers of a real cluster are privileged too).
``Informer`` is the list-then-watch loop every Kubernetes controller runs."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from .emulator import HARNESS_AGENT
from .objects import JSON
from .rbac import HARNESS_TOKEN

log = logging.getLogger(__name__)

EventHandler = Callable[[str, JSON], Awaitable[None]]


class ApiFailure(Exception):
    """A non-2xx answer; ``status`` and the server's ``Status`` message."""

    def __init__(self, status: int, body: Any) -> None:
        message = body.get("message") if isinstance(body, dict) else str(body)
        super().__init__(f"{status}: {message}")
        self.status, self.message = status, message


class HarnessClient:
    """Minimal async client for the kubelet and controllers in this package."""

    def __init__(self, url: str, component: str) -> None:
        self.url = url
        self.session = aiohttp.ClientSession(
            headers={"User-Agent": f"{HARNESS_AGENT}/{component}",
                     "Authorization": f"Bearer {HARNESS_TOKEN}"},
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))

    async def close(self) -> None:
        await self.session.close()

    async def request(self, method: str, path: str, body: Any = None,
                      content_type: str = "application/json",
                      params: JSON | None = None) -> Any:
        data = json.dumps(body) if body is not None else None
        async with self.session.request(method, self.url + path, data=data, params=params,
                                        headers={"Content-Type": content_type}) as resp:
            text = await resp.text()
            try:
                payload = json.loads(text) if text else None
            except ValueError:
                payload = text
            if resp.status >= 300:
                raise ApiFailure(resp.status, payload)
            return payload

    async def create(self, path: str, obj: JSON) -> JSON:
        return await self.request("POST", path, obj)

    async def delete(self, path: str, propagation: str = "Background",
                     grace: int | None = None) -> None:
        opts: JSON = {"kind": "DeleteOptions", "apiVersion": "v1",
                      "propagationPolicy": propagation}
        if grace is not None:
            opts["gracePeriodSeconds"] = grace
        try:
            await self.request("DELETE", path, opts)
        except ApiFailure as exc:
            if exc.status != 404:
                raise

    async def replace_status(self, path: str, status: JSON) -> JSON | None:
        """Replace an object's whole ``status`` through ``/status`` (JSON patch)."""
        try:
            return await self.request("PATCH", path + "/status",
                                      [{"op": "add", "path": "/status", "value": status}],
                                      content_type="application/json-patch+json")
        except ApiFailure as exc:
            if exc.status != 404:
                raise
            return None


def path_of(obj: JSON) -> str:
    """The REST path of a core/v1 or batch/v1 object (the kinds the harness writes)."""
    kind, meta = obj["kind"], obj["metadata"]
    plural = {"Pod": "pods", "Job": "jobs", "Event": "events", "Node": "nodes"}[kind]
    base = "/apis/batch/v1" if kind == "Job" else "/api/v1"
    if kind == "Node":
        return f"{base}/nodes/{meta['name']}"
    return f"{base}/namespaces/{meta['namespace']}/{plural}/{meta['name']}"


class Informer:
    """Keeps ``cache`` (``(namespace, name) -> object``) in sync with a list path and calls
    ``handler(type, obj)`` for every change, relisting after 410 Gone or a dropped stream."""

    def __init__(self, client: HarnessClient, list_path: str, handler: EventHandler) -> None:
        self.client, self.list_path, self.handler = client, list_path, handler
        self.cache: dict[tuple[str, str], JSON] = {}
        self.synced = asyncio.Event()

    @staticmethod
    def key(obj: JSON) -> tuple[str, str]:
        return obj["metadata"].get("namespace", ""), obj["metadata"]["name"]

    async def run(self) -> None:
        while True:
            try:
                rv = await self._relist()
                await self._watch(rv)
            except asyncio.CancelledError:
                raise
            except Exception:  # the stream dropped or the server restarted: relist
                log.debug("informer %s restarting", self.list_path, exc_info=True)
                await asyncio.sleep(0.2)  # back off before relisting a failing server

    async def _relist(self) -> str:
        listing = await self.client.request("GET", self.list_path)
        fresh = {self.key(o): o for o in listing["items"]}
        for k, stale in list(self.cache.items()):
            if k not in fresh:
                del self.cache[k]
                await self.handler("DELETED", stale)
        for k, obj in fresh.items():
            old = self.cache.get(k)
            self.cache[k] = obj
            if old is None or old["metadata"]["resourceVersion"] != \
                    obj["metadata"]["resourceVersion"]:
                await self.handler("MODIFIED" if old else "ADDED", obj)
        self.synced.set()
        return listing["metadata"]["resourceVersion"]

    async def _watch(self, rv: str) -> None:
        params = {"watch": "true", "resourceVersion": rv, "allowWatchBookmarks": "false"}
        async with self.client.session.get(self.client.url + self.list_path,
                                           params=params) as resp:
            async for line in resp.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                obj = event["object"]
                if event["type"] == "ERROR":
                    return  # 410 Gone: relist
                if event["type"] == "DELETED":
                    self.cache.pop(self.key(obj), None)
                else:
                    self.cache[self.key(obj)] = obj
                await self.handler(event["type"], obj)
