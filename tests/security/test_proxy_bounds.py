"""#31: a body too big for the hub's proxy is the same JSON 413 as every tunehub server gives.

The proxy ``tunehub up`` runs (``python -m hub.proxy``, a real process over real HTTP) buffers a
request body whole before forwarding it. tornado cut bodies over 100 MB with a bare 400 and a
reset connection, so a client sending one through the hub got no reason and no field. Now the
proxy's public server has the request-bounds delegate (``tunehub_base/request_bounds.py``) with
its own bound, ``TUNEHUB_PROXY_MAX_BODY``: over it, declared or chunked, is a 413 naming ``body``
and the setting; under it, the body reaches the backend whole.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.polling import wait_for
from tests.service_fixtures import free_port

REPO = Path(__file__).resolve().parents[2]
MiB = 2**20

# A backend that answers every POST with the number of body bytes it received.
ECHO = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Echo(BaseHTTPRequestHandler):
    def do_GET(self):
        self._answer(b"up")

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        got = 0
        while got < length:
            got += len(self.rfile.read(min(length - got, 1 << 20)))
        self._answer(str(got).encode())

    def _answer(self, body):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Echo).serve_forever()
"""


@contextmanager
def proxy_in_front_of_echo(tmp_path: Path, env: dict[str, str]) -> Iterator[str]:
    """The real proxy process in front of :data:`ECHO`; yields the proxy's public URL."""
    backend_port, port, api_port = free_port(), free_port(), free_port()
    backend = subprocess.Popen([sys.executable, "-c", ECHO, str(backend_port)])
    log = tmp_path / f"proxy-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hub.proxy", "--ip", "127.0.0.1", "--port", str(port),
             "--api-ip", "127.0.0.1", "--api-port", str(api_port),
             "--default-target", f"http://127.0.0.1:{backend_port}"],
            env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    url = f"http://127.0.0.1:{port}/"

    def up() -> bool:
        assert proc.poll() is None, log.read_text()
        try:
            return httpx.get(url, timeout=2).text == "up"
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, timeout=60, what="the proxy and its backend")
        yield url
    finally:
        for p in (proc, backend):
            p.terminate()
            p.wait(timeout=30)


def chunked(total: int) -> Iterator[bytes]:
    """``total`` bytes sent chunked (a generator: no Content-Length)."""
    for _ in range(total // MiB):
        yield b"a" * MiB
    if total % MiB:
        yield b"a" * (total % MiB)


def assert_refused(r: httpx.Response, bound: int) -> None:
    assert r.status_code == 413, (r.status_code, r.text[:300])
    assert r.headers["Content-Type"] == "application/json"
    answer = r.json()
    assert answer["status"] == 413 and answer["field"] == "body", answer
    assert "TUNEHUB_PROXY_MAX_BODY" in answer["error"] and str(bound) in answer["error"], answer


def test_past_tornados_100_mb_the_proxy_answers_the_json_413(tmp_path: Path) -> None:
    """The default bound (100 MiB, where tornado's bare 400 was): 120 MiB declared and chunked
    are the JSON 413; a body under it reaches the backend whole."""
    with proxy_in_front_of_echo(tmp_path, {}) as url, httpx.Client(timeout=300) as client:
        assert_refused(client.post(url, content=b"a" * (120 * MiB)), 100 * MiB)
        assert_refused(client.post(url, content=chunked(120 * MiB)), 100 * MiB)
        r = client.post(url, content=chunked(3 * MiB + 5))
        assert r.status_code == 200 and r.text == str(3 * MiB + 5), r.text


@pytest.mark.parametrize("send", ["declared", "chunked"])
def test_the_proxys_bound_is_its_setting(tmp_path: Path, send: str) -> None:
    """A lower ``TUNEHUB_PROXY_MAX_BODY`` in front of the tuner's own bound: one byte over is
    refused, the bound itself is forwarded, and the proxy keeps serving after a refusal."""
    bound = MiB

    def body(size: int) -> bytes | Iterator[bytes]:
        return b"a" * size if send == "declared" else chunked(size)

    with proxy_in_front_of_echo(tmp_path, {"TUNEHUB_PROXY_MAX_BODY": str(bound)}) as url, \
            httpx.Client(timeout=120) as client:
        assert_refused(client.post(url, content=body(bound + 1)), bound)
        assert_refused(client.post(url, content=body(8 * bound)), bound)
        r = client.post(url, content=body(bound))
        assert r.status_code == 200 and r.text == str(bound), r.text
