"""#31 items 3 (requests) and 5: one person's requests cannot stall or starve everyone else's.

Against a real hub with the tuner service behind its real proxy (``_request_bounds_fixtures``),
and the real proxy process alone with a cap on its descriptors: an 8× oversized body is a 413
naming ``body`` while another person's requests keep answering, and so is a chunked one, through
the proxy or straight to the service, past tornado's own 100 MB cut (nothing stored changes);
JSON nested 100,000 deep, or with hundreds of thousands of values, is a 400 naming ``body``
(never a 500); a 1.9 MiB helper module parsed for a warm start does not hold the service's event
loop; slow-loris clients holding half-sent requests neither exhaust the proxy's descriptors nor
fill its log; and an address a client writes into ``X-Real-Ip``/``X-Forwarded-For`` is not the
one the tuner records, unless the connection is the hub proxy's (its client certificate).
(``tunehub model serve`` has the same bounds: ``test_serving_bounds.py``.)"""

from __future__ import annotations

import os
import re
import resource
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.polling import wait_for
from tests.security import _request_bounds_fixtures as fixtures
from tests.security._platform_tls_fixtures import signed_pairs
from tests.security._request_bounds_fixtures import MAX_BODY, Lab
from tests.service_fixtures import free_port

lab = fixtures.lab  # the fixture, found by pytest under this name

pytestmark = [pytest.mark.slow]

#: How long another person's request may take while an attack runs (it takes milliseconds
#: otherwise; a stalled event loop held it for seconds).
PROMPT = 2.0


def answers_promptly(client: httpx.Client, path: str = "sweeps") -> None:
    began = time.monotonic()
    r = client.get(path)
    took = time.monotonic() - began
    assert r.status_code == 200, r.text
    assert took < PROMPT, f"GET {path} took {took:.1f}s during the attack"


def test_oversized_body_is_a_413_while_others_keep_answering(lab: Lab) -> None:
    body = b'{"spec": "' + b"a" * (8 * MAX_BODY) + b'"}'
    answers: list[httpx.Response] = []

    def attack() -> None:
        with httpx.Client(timeout=120) as c:
            answers.append(c.post(f"{lab.hub.api}sweeps", content=body,
                                  headers={**lab.alice.headers,
                                           "Content-Type": "application/json"}))

    attackers = [threading.Thread(target=attack) for _ in range(4)]
    for t in attackers:
        t.start()
    while any(t.is_alive() for t in attackers):
        answers_promptly(lab.bob)
    for t in attackers:
        t.join()
    assert len(answers) == 4
    for r in answers:
        assert r.status_code == 413, r.text
        assert r.json()["field"] == "body" and "TUNEHUB_API_MAX_BODY" in r.json()["error"]
    # A body just under the bound is read and judged as usual.
    r = lab.alice.post("sweeps", content=b'{"spec": "' + b"a" * (MAX_BODY - 100) + b'"}',
                       headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["field"] == "spec", r.text


def _chunked(total: int) -> Iterator[bytes]:
    """A sweep body of ``total`` bytes, sent chunked (a generator: no Content-Length)."""
    yield b'{"spec": "'
    for _ in range(total // 65536):
        yield b"a" * 65536
    yield b'"}'


def _service_url(lab: Lab) -> str:
    """The tuner service's own address (where notebooks and trials reach it, not the proxy)."""
    found = re.search(r"tuner service on (http://[^ ]+/services/tuner/)", lab.hub.log.read_text())
    assert found, lab.hub.log.read_text()[-3000:]
    return found.group(1) + "api/v1/"


def test_a_chunked_body_is_judged_like_a_declared_one(lab: Lab) -> None:
    headers = {**lab.alice.headers, "Content-Type": "application/json"}
    before = lab.alice.get("sweeps").json()
    # Under the bound, chunked through the proxy: it reaches the route, which judges the spec.
    r = httpx.post(f"{lab.hub.api}sweeps", content=_chunked(MAX_BODY // 2), headers=headers,
                   timeout=60)
    assert r.status_code == 400 and r.json()["field"] == "spec", r.text
    # Over it, through the proxy and straight to the service: the same 413 naming the limit.
    # Straight to the service also past tornado's own cut (100 MB), which was a bare 400.
    for url, size in ((f"{lab.hub.api}sweeps", 8 * MAX_BODY),
                      (f"{_service_url(lab)}sweeps", 8 * MAX_BODY),
                      (f"{_service_url(lab)}sweeps", 120 * 2**20)):
        r = httpx.post(url, content=_chunked(size), headers=headers, timeout=120)
        assert r.status_code == 413, (url, size, r.status_code, r.text)
        assert r.json()["field"] == "body" and "TUNEHUB_API_MAX_BODY" in r.json()["error"]
        assert str(MAX_BODY) in r.json()["error"]
    assert lab.alice.get("sweeps").json() == before  # nothing stored
    answers_promptly(lab.bob)


def test_a_forwarded_address_from_anyone_but_the_proxy_is_not_believed(lab: Lab) -> None:
    """Straight to the service, and through the proxy without its TLS client certificate
    (this hub runs without internal TLS): the address the tuner records is the connection's,
    never the one the client wrote."""
    spoof = {"X-Real-Ip": "203.0.113.7", "X-Forwarded-For": "203.0.113.8",
             "X-Forwarded-Proto": "https", "X-Scheme": "https"}
    for n, url in enumerate((_service_url(lab), lab.hub.api)):
        r = httpx.get(f"{url}sweeps?probe=spoof{n}", headers={**lab.alice.headers, **spoof},
                      timeout=30)
        assert r.status_code == 200, r.text
    # The access line is written after the answer is sent: read the log until both are there.
    def both_logged() -> list[str]:
        lines = lab.hub.log.read_text().splitlines()
        seen = [line for line in lines if "probe=spoof" in line and "tornado.access" in line]
        return seen if len(seen) == 2 else []
    seen = wait_for(both_logged, 30, "both requests in the tuner's access log")
    log = lab.hub.log.read_text()
    assert all("(127.0.0.1)" in line for line in seen), seen
    assert "203.0.113." not in log


SEEN_AS = """
import asyncio, sys, tornado.web
from tunehub_base import tls
from tunehub_base.request_bounds import BoundedApplication, RequestLimits

class SeenAs(tornado.web.RequestHandler):
    def get(self):
        self.finish(self.request.remote_ip)

async def main():
    cert, key, ca, port = sys.argv[1:5]
    app = BoundedApplication([(r"/", SeenAs)], request_limits=RequestLimits())
    app.listen(int(port), "127.0.0.1", ssl_options=tls.server_context(cert, key, ca, False))
    await asyncio.Event().wait()

asyncio.run(main())
"""


def test_only_the_proxys_certificate_may_name_the_client(tmp_path: Path) -> None:
    """The rule alone, on a real TLS server built like the tuner's: ``X-Real-Ip`` names the
    client only on a connection whose verified client certificate is the proxy's; a person's
    own certificate (signed by the same CA) or none leaves the connection's address."""
    from tunehub_base import tls

    ca, pairs = signed_pairs(tmp_path / "certs", [tls.SERVICE_IDENTITY, tls.PROXY_IDENTITY,
                                         tls.notebook_identity("bob")])
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SEEN_AS, *pairs[tls.SERVICE_IDENTITY], ca,
                               str(port)], cwd=Path(__file__).resolve().parents[2])
    url = f"https://127.0.0.1:{port}/"

    def seen_as(client_pair: tuple[str, str] | None, claimed: str = "10.1.2.3") -> str:
        context = tls.pinned_client_context(ca, tls.SERVICE_IDENTITY, *(client_pair or ()))
        return httpx.get(url, verify=context, timeout=10,
                         headers={"X-Real-Ip": claimed, "X-Forwarded-For": claimed}).text

    def up() -> bool:
        assert server.poll() is None
        try:
            return bool(seen_as(None))
        except (httpx.HTTPError, ssl.SSLError):
            return False

    try:
        wait_for(up, timeout=60, what="the TLS server")
        assert seen_as(pairs[tls.PROXY_IDENTITY]) == "10.1.2.3"
        assert seen_as(pairs[tls.PROXY_IDENTITY], "not an address") == "127.0.0.1"
        assert seen_as(pairs[tls.notebook_identity("bob")]) == "127.0.0.1"
        assert seen_as(None) == "127.0.0.1"
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.parametrize("route", ["sweeps", "trials/1/report"])
def test_deep_or_wide_json_is_a_400_naming_the_body(lab: Lab, route: str) -> None:
    headers = {"Content-Type": "application/json", "Authorization":
               lab.alice.headers["Authorization"] if route == "sweeps" else "Bearer x"}
    deep = b"[" * 100_000 + b"]" * 100_000
    deep_in_object = b'{"spec": ' + b"{\"a\": " * 50 + b"1" + b"}" * 50 + b"}"
    wide = b"[" + b"0," * 300_000 + b"0]"
    for body, words in ((deep, "nested deeper"), (deep_in_object, "nested deeper"),
                        (wide, "JSON values"), (b"{oops", "not valid JSON")):
        r = httpx.post(f"{lab.hub.api}{route}", content=body, headers=headers, timeout=60)
        assert r.status_code == 400, (route, words, r.status_code, r.text)
        assert r.json()["field"] == "body" and words in r.json()["error"], r.text
    answers_promptly(lab.bob)


HELPER_LINES = 50_000  # ~1.9 MiB of Python: parsing it on the loop held it for seconds


def test_a_big_helper_module_does_not_hold_the_service(lab: Lab) -> None:
    code = lab.code.parent / "bighelper"
    code.mkdir()
    (code / "helper.py").write_text("".join(f"v{i} = [{i}, ({i}, {{'k': {i}}})]\n"
                                            for i in range(HELPER_LINES)))
    (code / "train.py").write_text("import helper, tuner\ntuner.params()\ntuner.report(1.0)\n")
    spec = {**lab.spec("big"), "code": str(code), "command": "python train.py"}
    r = lab.alice.post("sweeps", json={"spec": spec})
    assert r.status_code == 201, r.text
    sid = int(r.json()["id"])

    def ended() -> bool:
        answers_promptly(lab.bob)  # every poll, while the trial is being launched
        return str(lab.alice.get(f"sweeps/{sid}").json()["state"]) in (
            "completed", "failed", "cancelled")

    wait_for(ended, timeout=180, what="the sweep with the big helper module to end")
    assert lab.alice.get(f"sweeps/{sid}").json()["state"] == "completed"
    trials = lab.alice.get(f"sweeps/{sid}/trials").json()
    log = lab.alice.get(f"sweeps/{sid}/trials/0/logs").text
    assert trials[0]["state"] == "completed" and "warm start" in log, log[-2000:]


# --- the proxy under slow clients ---------------------------------------------------------

DESCRIPTORS = 400  # the proxy's whole allowance in this test (soft and hard)
PER_CLIENT = 50
HEADER_TIMEOUT = 2
ATTACKERS = 500  # more than the proxy's descriptors: this exhausted them before


def _cap_descriptors() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (DESCRIPTORS, DESCRIPTORS))


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The proxy ``tunehub up`` runs (``python -m hub.proxy``) in front of a real HTTP server,
    with few descriptors and a short header timeout."""
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "index.html").write_text("hello")
    backend_port, port, api_port = free_port(), free_port(), free_port()
    backend = subprocess.Popen([sys.executable, "-m", "http.server", str(backend_port),
                                "--bind", "127.0.0.1"], cwd=tmp_path / "www",
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = tmp_path / "proxy.log"
    env = {**os.environ, "TUNEHUB_PROXY_HEADER_TIMEOUT": str(HEADER_TIMEOUT),
           "TUNEHUB_PROXY_MAX_CLIENT_CONNECTIONS": str(PER_CLIENT),
           "TUNEHUB_LOG_REPEAT_SECONDS": "600"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hub.proxy", "--ip", "127.0.0.1", "--port", str(port),
             "--api-ip", "127.0.0.1", "--api-port", str(api_port),
             "--default-target", f"http://127.0.0.1:{backend_port}"],
            env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_cap_descriptors,
            cwd=Path(__file__).resolve().parents[2])
    url = f"http://127.0.0.1:{port}/"

    def up() -> bool:
        assert proc.poll() is None, log.read_text()
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, timeout=60, what="the proxy and its backend")
        yield url, log
    finally:
        for p in (proc, backend):
            p.terminate()
            p.wait(timeout=30)


def _half_sent(port: int) -> socket.socket | None:
    """A connection from another client address (127.0.0.2) holding a request's first line."""
    s = socket.socket()
    s.bind(("127.0.0.2", 0))
    s.settimeout(5)
    try:
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
    except OSError:
        s.close()
        return None
    return s


def _closed_by_proxy(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


def test_slow_loris_clients_neither_lock_others_out_nor_fill_the_log(
    proxy: tuple[str, Path],
) -> None:
    url, log = proxy
    port = int(url.rsplit(":", 1)[1].strip("/"))
    held = [s for s in (_half_sent(port) for _ in range(ATTACKERS)) if s is not None]
    try:
        began = time.monotonic()
        r = httpx.get(url, timeout=10)
        assert r.status_code == 200 and r.text == "hello"
        assert time.monotonic() - began < PROMPT
        # All but the first PER_CLIENT of the attacker's connections were closed at once ...
        wait_for(lambda: sum(_closed_by_proxy(s) for s in held) >= len(held) - PER_CLIENT,
                 timeout=HEADER_TIMEOUT, what="connections over the per-client cap to close")
        # ... and those it kept, once their headers were late.
        wait_for(lambda: all(_closed_by_proxy(s) for s in held), timeout=HEADER_TIMEOUT + 10,
                 what="half-sent requests to time out")
    finally:
        for s in held:
            s.close()
    text = log.read_text()
    assert text.count("refused") == 1, text[-3000:]  # the rest were counted, not written
    assert len(text) < 50_000, f"{len(text)} bytes of proxy log"


def test_a_repeated_error_is_written_once_per_interval_with_a_count() -> None:
    import io
    import logging

    from hub.log_limits import RepeatFilter

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(RepeatFilter(interval=0.5))
    log = logging.getLogger("tunehub.test.repeats")
    log.addHandler(handler)
    log.propagate = False
    try:
        for _ in range(1000):
            try:
                raise OSError(24, "Too many open files")
            except OSError:
                log.exception("accept failed")
        log.error("another error")
        assert out.getvalue().count("accept failed") == 1
        assert out.getvalue().count("Traceback") == 1 and "another error" in out.getvalue()
        began = time.monotonic()
        wait_for(lambda: time.monotonic() - began > 0.5, timeout=5, what="the interval")
        try:
            raise OSError(24, "Too many open files")
        except OSError:
            log.exception("accept failed")
        assert "accept failed (999 more like this in the last" in out.getvalue()
        assert out.getvalue().count("Traceback") == 1  # shown once
    finally:
        log.removeHandler(handler)
