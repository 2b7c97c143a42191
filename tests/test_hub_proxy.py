"""The proxy ``tunehub up`` runs (``python -m hub.proxy``) passes the websocket subprotocol the
backend chose back to the client, as browsers require (JupyterLab's kernel connections)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator

import httpx
import pytest
import tornado.web
import tornado.websocket

from tests.kube.waiting import eventually
from tests.service_fixtures import free_port

SUBPROTOCOL = "v1.kernel.websocket.jupyter.org"


class Echo(tornado.websocket.WebSocketHandler):
    def select_subprotocol(self, subprotocols: list[str]) -> str | None:
        return SUBPROTOCOL if SUBPROTOCOL in subprotocols else None

    def on_message(self, message: str | bytes) -> None:
        self.write_message(message, binary=isinstance(message, bytes))


@pytest.fixture
async def proxied() -> AsyncIterator[str]:
    """A websocket echo backend behind a running ``hub.proxy``; yields the proxied ws URL."""
    backend_port, port, api_port = free_port(), free_port(), free_port()
    server = tornado.web.Application([(r"/svc/echo", Echo)]).listen(backend_port, "127.0.0.1")
    token = "proxy-test-token"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hub.proxy", "--ip", "127.0.0.1", "--port", str(port),
         "--api-ip", "127.0.0.1", "--api-port", str(api_port)],
        env={**os.environ, "CONFIGPROXY_AUTH_TOKEN": token},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    api = f"http://127.0.0.1:{api_port}/api/routes"
    headers = {"Authorization": f"token {token}"}

    async def route_added() -> bool:
        try:
            async with httpx.AsyncClient() as http:
                r = await http.post(f"{api}/svc", headers=headers,
                                    json={"target": f"http://127.0.0.1:{backend_port}"})
            return r.status_code == 201
        except httpx.HTTPError:
            return False

    try:
        await eventually(route_added, 30, "the proxy's API to add a route")
        yield f"ws://127.0.0.1:{port}/svc/echo"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        server.stop()


async def test_websocket_subprotocol_is_passed_through(proxied: str) -> None:
    conn = await asyncio.wait_for(
        tornado.websocket.websocket_connect(proxied, subprotocols=[SUBPROTOCOL, "other"]), 30
    )
    try:
        assert conn.selected_subprotocol == SUBPROTOCOL
        await conn.write_message(b"\x00binary", binary=True)
        assert await asyncio.wait_for(conn.read_message(), 30) == b"\x00binary"
    finally:
        conn.close()


async def test_websocket_without_subprotocol_still_connects(proxied: str) -> None:
    conn = await asyncio.wait_for(tornado.websocket.websocket_connect(proxied), 30)
    try:
        assert conn.selected_subprotocol is None
        await conn.write_message("hello")
        assert await asyncio.wait_for(conn.read_message(), 30) == "hello"
    finally:
        conn.close()
