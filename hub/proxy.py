"""The proxy ``tunehub up`` runs: configurable-http-proxy from PyPI (no Node.js), with two fixes
to its websocket handling, both needed by JupyterLab's kernel connections:

- it does not answer with the subprotocol the backend chose. JupyterLab offers
  ``v1.kernel.websocket.jupyter.org``; a browser that offered a subprotocol and got none back
  fails the handshake, JupyterLab reconnects, and a cell run meanwhile is silently never sent;
- it forwards the client's binary frames to the backend as text frames, which breaks the v1
  kernel protocol (binary messages) once the subprotocol is agreed.

and two to plain HTTP, both felt as soon as more than a handful of people use the hub:

- it buffered every response whole before sending any of it, so an event stream (JupyterHub's
  spawn progress page) showed nothing until the spawn was over; responses now stream through
  as they arrive;
- it sent every request through tornado's default HTTP client: at most 10 requests in flight to
  all backends together and 20 s to answer. With 50 users starting servers, requests queued for
  tens of seconds and then failed with 503. Here there is no practical cap on requests in
  flight and, as in the Node.js proxy, no answer deadline unless ``--proxy-timeout`` sets one.

The Node.js proxy does all of this right; these overrides do what it does.

Run as ``python -m hub.proxy`` with configurable-http-proxy's own command-line options.
"""

from __future__ import annotations

from typing import Any

from configurable_http_proxy import cli
from configurable_http_proxy.configproxy import PythonProxy
from configurable_http_proxy.handlers import ProxyHandler
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.httputil import HTTPHeaders, parse_response_start_line
from tornado.iostream import StreamClosedError
from tornado.web import Application

#: Requests in flight to backends at once (tornado's default is 10 for the whole proxy).
MAX_REQUESTS_IN_FLIGHT = 10_000
#: "No deadline" for an answer: long enough for any event stream; connecting still times out.
NO_DEADLINE = 7 * 24 * 3600.0
#: Hop-by-hop or re-encoded by the client (it decompresses): not passed on.
_NOT_FORWARDED = {"content-length", "transfer-encoding", "content-encoding", "connection"}


class TunehubProxyHandler(ProxyHandler):
    """Streams responses; answers a websocket upgrade with the backend's subprotocol and keeps
    binary frames binary."""

    def _get_proxy_request(self, url: str) -> HTTPRequest:
        request: HTTPRequest = super()._get_proxy_request(url)
        if self.proxy.proxy_timeout is None:
            request.request_timeout = NO_DEADLINE
        return request

    async def call_proxy(self, path: str | None = None) -> None:
        url = await self.get_target_url(path)
        if url is None:
            return
        request = self._get_proxy_request(url)
        headers = HTTPHeaders()
        started = False  # response headers sent to our client: errors can no longer be a 503

        def on_header(line: str) -> None:
            nonlocal headers, started
            if line.startswith("HTTP/"):  # a new response (after 100 Continue, a fresh one)
                self.set_status(parse_response_start_line(line.strip()).code)
                headers = HTTPHeaders()
            elif line.strip():
                headers.parse_line(line)
            elif self.get_status() != 100:  # the blank line: the headers are complete
                self._copy_headers(headers)
                started = True

        def on_chunk(chunk: bytes) -> None:
            self.write(chunk)
            # If our client has gone, the flush fails; that is not an error worth a log line.
            self.flush().add_done_callback(lambda done: done.exception())

        request.header_callback = on_header
        request.streaming_callback = on_chunk
        try:
            await AsyncHTTPClient().fetch(request, raise_error=False)
        except Exception as err:
            if not started:
                await self.handle_proxy_error(503, err)
                return
            self.proxy.log.warning(f"{self.request.method} {url}: backend failed mid-answer: {err}")
        try:
            self.finish()
        except StreamClosedError:  # our client went away first
            pass

    def _copy_headers(self, headers: HTTPHeaders) -> None:
        existing = {name.lower() for name, _ in self._headers.get_all()}
        for name, value in headers.get_all():
            if name.lower() in _NOT_FORWARDED:
                continue
            if name.lower() in existing:  # the proxy's own Server, Content-Type, Date
                self.set_header(name, value)
            else:
                self.add_header(name, value)

    def select_subprotocol(self, subprotocols: list[str]) -> str | None:
        # get() connects to the backend (forwarding the client's Sec-WebSocket-Protocol)
        # before tornado asks this, so the backend's answer is known here.
        client = getattr(self, "ws_client", None)
        chosen = client.selected_subprotocol if client is not None else None
        return chosen if chosen in subprotocols else None

    def on_message(self, message: str | bytes) -> None:
        if self.ws_client:
            prefix = self.target["prefix"] if self.target else ""
            if prefix:
                self.proxy.update_last_activity(prefix)
            self.ws_client.write_message(message, binary=isinstance(message, bytes))


class TunehubProxy(PythonProxy):
    """configurable-http-proxy whose public app uses :class:`TunehubProxyHandler`."""

    def __init__(self, options: Any = ()) -> None:
        super().__init__(options)
        AsyncHTTPClient.configure(None, max_clients=MAX_REQUESTS_IN_FLIGHT)
        self.proxy_app = Application([(r"/(.*)", TunehubProxyHandler, {"proxy": self})])


def main() -> None:
    cli.PythonProxy = TunehubProxy  # the CLI builds its proxy from this module-level name
    cli.main()


if __name__ == "__main__":
    main()
