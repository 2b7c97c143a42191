"""The notebook client waits a tuner restart out: while nothing listens on the tuner's port (the
service killed, its keeper starting it again) a call is sent again with backoff, said once, and
answered once the tuner is back; a port held by something that is not the tuner (TLS fails) is
said at once and never retried into. Real HTTP on loopback; the tuner stand-in is Python's own
HTTP server, started on the port only after the client has said it waits."""

from __future__ import annotations

import http.server
import json
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.polling import InBackground, wait_for
from tunehub_base.ports import unclaimed_ports
from tuner.errors import TunehubError
from tuner.sdk.client import TunerClient


class _Sweeps(http.server.BaseHTTPRequestHandler):
    """Answers ``GET .../api/v1/sweeps`` with an empty list, as the tuner does for a new person."""

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        body = json.dumps([]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def _tuner_on(port: int) -> Iterator[None]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Sweeps)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def client_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TUNEHUB_API_CA", "TUNEHUB_API_URL"):
        monkeypatch.delenv(name, raising=False)


def test_a_call_waits_while_nothing_listens_and_is_answered_once_the_tuner_is_back(
    client_env: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tunehub.client")
    (port,) = unclaimed_ports(1)
    client = TunerClient(url=f"http://127.0.0.1:{port}/services/tuner", token="a-token")
    waiting = InBackground(lambda: client.request("GET", "sweeps"))

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "tunehub.client"]

    wait_for(lambda: waiting.answers or any("unavailable since" in m for m in said()),
             timeout=30, what="the client to say the tuner is away")
    assert not waiting.answers, waiting.answers  # still waiting: no error for a restart
    with _tuner_on(port):
        answers = waiting.join(timeout=60)
        assert answers == [[]], answers
    messages = said()
    away = [m for m in messages if "unavailable since" in m]
    assert len(away) == 1 and "cannot connect" in away[0], messages
    assert len([m for m in messages if "answers again" in m]) == 1, messages


def test_a_port_that_fails_tls_is_said_at_once(
    client_env: None, caplog: pytest.LogCaptureFixture
) -> None:
    """Something answers on the tuner's port but not with TLS (as a squatter without the tuner's
    certificate would fail): the call fails at once, naming the tuner's address."""
    (port,) = unclaimed_ports(1)
    client = TunerClient(url=f"https://127.0.0.1:{port}/services/tuner", token="a-token")
    with _tuner_on(port):
        started = time.monotonic()
        with pytest.raises(TunehubError, match="cannot reach the tuner"):
            client.request("GET", "sweeps")
        assert time.monotonic() - started < 5  # no backoff: not an outage
    assert not [r for r in caplog.records if "unavailable since" in r.getMessage()]
