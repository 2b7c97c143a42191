"""The proxy ``tunehub up`` runs (``python -m hub.proxy``) passes the websocket subprotocol the
backend chose back to the client, as browsers require (JupyterLab's kernel connections), streams
answers as they come (the spawn progress page), and does not queue requests behind a handful of
slow ones (many users at once)."""

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

from kubesim.waiting import eventually
from tests.service_fixtures import free_port

SUBPROTOCOL = "v1.kernel.websocket.jupyter.org"


class Echo(tornado.websocket.WebSocketHandler):
    def select_subprotocol(self, subprotocols: list[str]) -> str | None:
        return SUBPROTOCOL if SUBPROTOCOL in subprotocols else None

    def on_message(self, message: str | bytes) -> None:
        self.write_message(message, binary=isinstance(message, bytes))


class Stream(tornado.web.RequestHandler):
    """Sends a first part at once and the rest when the test releases it."""

    async def get(self) -> None:
        self.set_header("Content-Type", "text/event-stream")
        self.write("data: first\n\n")
        await self.flush()
        await self.settings["release"].wait()
        self.write("data: second\n\n")


class Gate(tornado.web.RequestHandler):
    """Answers only once ``GATE`` requests are waiting here at the same time."""

    async def get(self) -> None:
        self.settings["arrived"].append(1)
        if len(self.settings["arrived"]) >= GATE:
            self.settings["all_in"].set()
        await self.settings["all_in"].wait()
        self.write("through")


GATE = 15  # more than tornado's default client allows in flight (10)


@pytest.fixture
async def backend() -> tornado.web.Application:
    return tornado.web.Application(
        [(r"/svc/echo", Echo), (r"/svc/stream", Stream), (r"/svc/gate", Gate)],
        release=asyncio.Event(), all_in=asyncio.Event(), arrived=[],
    )


@pytest.fixture
async def proxied(backend: tornado.web.Application) -> AsyncIterator[str]:
    """The test backend behind a running ``hub.proxy``; yields the proxied ws URL of the
    echo handler (its siblings are beside it)."""
    backend_port, port, api_port = free_port(), free_port(), free_port()
    server = backend.listen(backend_port, "127.0.0.1")
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


async def test_answers_stream_through_as_the_backend_sends_them(
    proxied: str, backend: tornado.web.Application
) -> None:
    url = proxied.replace("ws://", "http://").replace("/echo", "/stream")
    async with httpx.AsyncClient(timeout=30) as http, http.stream("GET", url) as r:
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/event-stream"
        chunks = r.aiter_text()
        # The backend has not finished (it waits for us): a buffering proxy sends nothing yet.
        assert await asyncio.wait_for(anext(chunks), 30) == "data: first\n\n"
        backend.settings["release"].set()
        rest = "".join([chunk async for chunk in chunks])
    assert rest == "data: second\n\n"


async def test_many_slow_requests_are_in_flight_at_once(proxied: str) -> None:
    url = proxied.replace("ws://", "http://").replace("/echo", "/gate")
    async with httpx.AsyncClient(timeout=60) as http:
        answers = await asyncio.gather(*(http.get(url) for _ in range(GATE)))
    assert [(r.status_code, r.text) for r in answers] == [(200, "through")] * GATE
