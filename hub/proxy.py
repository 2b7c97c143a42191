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

A request body over ``TUNEHUB_PROXY_MAX_BODY`` (declared or chunked) is read and dropped and
answered with the JSON 413 every tunehub server gives (:mod:`tunehub_base.request_bounds`),
naming ``body`` and the setting; tornado's own cut at 100 MB was a bare 400 and a reset.

And it is guarded against clients that hold connections open (:class:`GuardedHTTPServer`): 20
processes holding half-sent requests once took all of its 20,000 descriptors, after which nobody's
request was accepted and the hub's log grew ~98 MB of ``EMFILE`` tracebacks. Now a request's
headers must arrive within ``TUNEHUB_PROXY_HEADER_TIMEOUT`` and its body within
``TUNEHUB_PROXY_BODY_TIMEOUT``; one client address holds at most
``TUNEHUB_PROXY_MAX_CLIENT_CONNECTIONS`` connections and all clients together at most
``TUNEHUB_PROXY_MAX_CONNECTIONS`` (by default half the descriptors the process may open, the other
half being the connections to backends), so descriptors never run out; and a repeated error is
logged once per ``TUNEHUB_LOG_REPEAT_SECONDS`` (:mod:`hub.log_limits`).

The PyPI proxy also refuses every TLS option (``NotImplementedError``), and JupyterHub's
``internal_ssl`` passes them. This module implements them (:func:`main`), and goes one step
further than the Node.js proxy: every backend must present the certificate of *the component its
route belongs to* (the hub's, the service's, that person's server's; see :mod:`tunehub_base.tls`),
not merely one the internal CA signed. A person who binds a free backend port therefore gets a
failed handshake, never a browser's request with its cookies and tokens. The REST API can listen
on a Unix socket (``--api-socket``, JupyterHub's ``http+unix://`` API URL) in the hub's root-only
directory, where nobody else can connect to it or take its place. A port that is taken is named
with its holder, and the proxy exits non-zero (JupyterHub then says the proxy failed).

Run as ``python -m hub.proxy`` with configurable-http-proxy's own command-line options.
"""

from __future__ import annotations

import errno
import logging
import resource
import socket
import ssl
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from configurable_http_proxy import cli
from configurable_http_proxy.configproxy import PythonProxy
from configurable_http_proxy.handlers import ProxyHandler
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.httpserver import HTTPServer
from tornado.httputil import HTTPHeaders, parse_response_start_line
from tornado.iostream import IOStream, StreamClosedError
from tornado.netutil import bind_unix_socket
from tornado.web import Application

from hub.log_limits import limit_repeats
from tunehub_base import ports, tls
from tunehub_base.options import setting
from tunehub_base.request_bounds import BoundedApplication, RequestLimits

log = logging.getLogger("tunehub.proxy")

#: Requests in flight to backends at once (tornado's default is 10 for the whole proxy).
MAX_REQUESTS_IN_FLIGHT = 10_000
#: "No deadline" for an answer: long enough for any event stream; connecting still times out.
NO_DEADLINE = 7 * 24 * 3600.0
#: Hop-by-hop or re-encoded by the client (it decompresses): not passed on.
_NOT_FORWARDED = {"content-length", "transfer-encoding", "content-encoding", "connection"}
#: A request's framing: its body is forwarded whole, framed by the proxy's own client.
_REQUEST_FRAMING = {"content-length", "transfer-encoding"}


class TunehubProxyHandler(ProxyHandler):
    """Streams responses; answers a websocket upgrade with the backend's subprotocol and keeps
    binary frames binary."""

    proxy: TunehubProxy

    def _get_proxy_request(self, url: str) -> HTTPRequest:
        request: HTTPRequest = super()._get_proxy_request(url)
        # The client's address is the one we accepted, whatever it claims: the hub (tornado
        # with xheaders) takes X-Real-Ip over X-Forwarded-For, so a client's own X-Real-Ip
        # would choose the address its failed logins count against (hub/login_throttle.py).
        request.headers["X-Real-Ip"] = self.request.remote_ip or ""
        # The body is forwarded whole, with its own Content-Length: the client's framing
        # (Transfer-Encoding: chunked) is not ours to pass on. Sent both, the backend refused
        # the message as malformed and reset it, so no chunked request reached the tuner.
        for name in [n for n in request.headers if n.lower() in _REQUEST_FRAMING]:
            del request.headers[name]
        if self.proxy.proxy_timeout is None:
            # No deadline to connect either (tornado's default is 20 s, TLS handshake
            # included): a server on a busy machine that takes longer to shake hands got a 503
            # for a page's stylesheet, and JupyterLab an "Error Loading Theme" dialog. A backend
            # that is gone still fails at once (connection refused).
            request.request_timeout = request.connect_timeout = NO_DEADLINE
        if self.target is not None:
            request.ssl_options = self.proxy.tls.backend_context(self.target["identity"])
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


#: Options that take a value, and switches, that :class:`ProxyTls` takes off the command line.
_TLS_VALUES = {"--ssl-key": "public_key", "--ssl-cert": "public_cert", "--ssl-ca": "public_ca",
               "--api-ssl-key": "api_key", "--api-ssl-cert": "api_cert", "--api-ssl-ca": "api_ca",
               "--client-ssl-key": "client_key", "--client-ssl-cert": "client_cert",
               "--client-ssl-ca": "client_ca", "--api-socket": "api_socket"}
_TLS_SWITCHES = {"--ssl-request-cert": "public_request_cert",
                 "--api-ssl-request-cert": "api_request_cert",
                 "--client-ssl-request-cert": None, "--ssl-reject-unauthorized": None,
                 "--api-ssl-reject-unauthorized": None, "--client-ssl-reject-unauthorized": None}


@dataclass
class ProxyTls:
    """The TLS (and API socket) options, which configurable-http-proxy's own parser refuses.

    A client certificate asked for is also required (``--*-request-cert`` implies
    ``--*-reject-unauthorized``): one that is asked for and not checked protects nothing."""

    public_key: str | None = None
    public_cert: str | None = None
    public_ca: str | None = None
    public_request_cert: bool = False
    api_key: str | None = None
    api_cert: str | None = None
    api_ca: str | None = None
    api_request_cert: bool = False
    client_key: str | None = None
    client_cert: str | None = None
    client_ca: str | None = None
    api_socket: str | None = None
    _backends: dict[str, ssl.SSLContext] = field(default_factory=dict)

    @classmethod
    def split(cls, argv: list[str]) -> tuple[ProxyTls, list[str]]:
        """These options from ``argv`` (``--opt value`` or ``--opt=value``), and the rest."""
        found: dict[str, Any] = {}
        rest: list[str] = []
        args = iter(argv)
        for arg in args:
            name, eq, value = arg.partition("=")
            if name in _TLS_VALUES:
                found[_TLS_VALUES[name]] = value if eq else next(args, "")
            elif name in _TLS_SWITCHES:
                attr = _TLS_SWITCHES[name]
                if attr:
                    found[attr] = True
            else:
                rest.append(arg)
        return cls(**found), rest

    def backend_context(self, identity: str) -> ssl.SSLContext | None:
        """How the proxy connects to a backend that must be ``identity``: with its client
        certificate, trusting the internal CAs and that name only (None: no internal TLS)."""
        if not self.client_ca:
            return None
        if identity not in self._backends:
            self._backends[identity] = tls.pinned_client_context(
                self.client_ca, identity, self.client_cert, self.client_key)
        return self._backends[identity]

    def server_context(self, api: bool) -> ssl.SSLContext | None:
        """TLS of the public server or the API; none for an API on a Unix socket (JupyterHub
        speaks plain HTTP there: the socket's directory is what keeps others out)."""
        if api and self.api_socket:
            return None
        key, cert = (self.api_key, self.api_cert) if api else (self.public_key, self.public_cert)
        if not (key and cert):
            return None
        ca, request = (self.api_ca, self.api_request_cert) if api else (
            self.public_ca, self.public_request_cert)
        return tls.server_context(cert, key, ca if request else None, require_client_cert=True)


def _backend_identity(data: dict[str, Any]) -> str:
    """The certificate name a route's backend must present: a person's server, a service, or
    the hub (JupyterHub's hub route, and the default target it gives the proxy)."""
    if "user" in data:
        return tls.notebook_identity(str(data["user"]))
    if "service" in data:
        return tls.SERVICE_IDENTITY
    return tls.HUB_IDENTITY


class TunehubProxy(PythonProxy):
    """configurable-http-proxy whose public app uses :class:`TunehubProxyHandler`."""

    #: Set by :func:`main` before the CLI builds the proxy.
    tls = ProxyTls()

    def __init__(self, options: Any = ()) -> None:
        super().__init__(options)
        hub_context = self.tls.backend_context(tls.HUB_IDENTITY)
        # Requests without a route of their own (the hub's error pages) go to the hub.
        AsyncHTTPClient.configure(None, max_clients=MAX_REQUESTS_IN_FLIGHT,
                                  defaults={"ssl_options": hub_context} if hub_context else None)
        # Bodies bounded as in every tunehub server (tunehub_base/request_bounds.py): one over
        # TUNEHUB_PROXY_MAX_BODY is read and dropped and answered with the same JSON 413, not
        # tornado's bare 400 and reset at its own 100 MB.
        limits = RequestLimits(max_body=setting("TUNEHUB_PROXY_MAX_BODY").number(),
                               body_setting="TUNEHUB_PROXY_MAX_BODY")
        self.proxy_app = BoundedApplication(
            [(r"/(.*)", TunehubProxyHandler, {"proxy": self})], tunehub_public=True,
            request_limits=limits)

    def target_for_req(self, host: str | None, path: str) -> dict[str, Any] | None:
        target: dict[str, Any] | None = super().target_for_req(host, path)
        if target is not None:
            data = self._routes.get(target["prefix"]) or {}
            target["identity"] = _backend_identity(data)
        return target


#: Descriptors kept for everything but client connections and their backend connections.
RESERVED_DESCRIPTORS = 64


def descriptor_budget() -> int:
    """Client connections the proxy may hold in all: ``TUNEHUB_PROXY_MAX_CONNECTIONS``, or
    half the descriptors it may open (raised to the hard limit first) less a reserve."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    configured = setting("TUNEHUB_PROXY_MAX_CONNECTIONS").number()
    return configured or max(16, (soft - RESERVED_DESCRIPTORS) // 2)


class GuardedHTTPServer(HTTPServer):
    """tornado's HTTP server with the proxy's guards (see the module's docstring): header and
    body timeouts, and connection caps per client address and in all. A connection over a cap
    is accepted and closed at once, which frees its descriptor and the listen queue."""

    def initialize(self, *args: Any, **kwargs: Any) -> None:
        # tornado's idle_connection_timeout is also its header timeout: the time from the
        # connection (or the previous answer) until a request's headers are complete.
        kwargs.setdefault("idle_connection_timeout",
                          float(setting("TUNEHUB_PROXY_HEADER_TIMEOUT").number()))
        kwargs.setdefault("body_timeout", float(setting("TUNEHUB_PROXY_BODY_TIMEOUT").number()))
        super().initialize(*args, **kwargs)
        self.max_per_client = setting("TUNEHUB_PROXY_MAX_CLIENT_CONNECTIONS").number()
        self.max_total = descriptor_budget()
        self.per_client: Counter[str] = Counter()

    @staticmethod
    def _client(address: Any) -> str:
        return str(address[0]) if isinstance(address, tuple) and address else str(address)

    def handle_stream(self, stream: IOStream, address: tuple[Any, ...]) -> None:
        client = self._client(address)
        if self.per_client[client] >= self.max_per_client or len(self._connections) >= \
                self.max_total:
            log.warning("connection from %s refused: it holds %d (at most %d per client), "
                        "%d in all (at most %d)", client, self.per_client[client],
                        self.max_per_client, len(self._connections), self.max_total)
            stream.close()
            return
        self.per_client[client] += 1
        super().handle_stream(stream, address)

    def on_close(self, server_conn: object) -> None:
        super().on_close(server_conn)
        client = self._client(getattr(getattr(server_conn, "context", None), "address", ""))
        self.per_client[client] -= 1
        if self.per_client[client] <= 0:
            del self.per_client[client]


class _Server(GuardedHTTPServer):
    """The CLI's HTTP servers, with our TLS options, the API's Unix socket, and a clear exit
    when a port is taken."""

    tunehub_api = False  # the REST API's server, not the public one

    def listen(self, port: int, address: str | None = None,
               family: socket.AddressFamily = socket.AF_UNSPEC, backlog: int = 128,
               flags: int | None = None, reuse_port: bool = False) -> None:
        if self.tunehub_api and TunehubProxy.tls.api_socket:
            # In the hub's root-only directory: nobody else can connect, or listen first.
            self.add_socket(bind_unix_socket(TunehubProxy.tls.api_socket, mode=0o600))
            return
        try:
            super().listen(port, address or "", family, backlog, flags, reuse_port)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            what = "the proxy's API" if self.tunehub_api else "the proxy"
            print(ports.in_use_message(what, address or "*", port), file=sys.stderr, flush=True)
            sys.exit(1)


def _make_server(app: Application, **kwargs: Any) -> HTTPServer:
    api = not app.settings.get("tunehub_public")
    server = _Server(app, ssl_options=TunehubProxy.tls.server_context(api), **kwargs)
    server.tunehub_api = api
    return server


def main(argv: list[str] | None = None) -> None:
    TunehubProxy.tls, rest = ProxyTls.split(sys.argv[1:] if argv is None else argv)
    cli.PythonProxy = TunehubProxy  # the CLI builds its proxy from this module-level name
    cli.HTTPServer = _make_server  # ... and its two servers from this one
    limit_repeats("configurable_http_proxy", "tornado", "asyncio", log)
    cli.main(args=rest)


if __name__ == "__main__":
    main()
