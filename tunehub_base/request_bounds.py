"""What every request to every HTTP server tunehub runs passes before any handler sees it: its
body's size, its JSON's number of values and depth, and the client address it is known by.

The servers: the tuner service (:mod:`tuner.service`), the CLI's loopback report endpoint
(:mod:`tuner.runtime`) and ``tunehub model serve`` (:mod:`tuner.serving.server`). Each is a
:class:`BoundedApplication`, so one rule holds for all three. The hub's proxy (``hub/proxy.py``)
puts the same delegate in front of its public server with its own, larger bound
(``TUNEHUB_PROXY_MAX_BODY``: it also carries notebook uploads), so a body too big for it is the
same JSON 413, never tornado's bare 400:

- **Body size.** A body over ``TUNEHUB_API_MAX_BODY``, whether its length is declared
  (``Content-Length``) or it arrives chunked, is answered 413 with a JSON reason naming ``body``
  and the limit; no handler ever exists for it, so nothing is stored or changed. Its bytes are
  read and dropped, never kept, and the answer is sent once the body is in, because closing a
  connection with unread data resets it and a peer that sends a body whole before reading (the
  hub's proxy) would lose the answer. A body still arriving :data:`DROP_AT_MOST` bytes past the
  bound is answered there and its connection closed. tornado's own cut (``max_body_size``, 100 MB:
  a bare 400 and a reset) never comes first: this module sets each request's size limit.
- **JSON.** :func:`parse_json` counts the values cheaply (``bytes.count`` of ``,``, ``[`` and
  ``{``, in C) before parsing (over ``TUNEHUB_API_MAX_JSON_ITEMS``: 400) and checks the depth
  after (over ``TUNEHUB_API_MAX_JSON_DEPTH``: 400), so parsing stays milliseconds and nothing
  deeper reaches code that recurses over it.
- **Client address.** ``X-Forwarded-For``/``X-Real-Ip``/``X-Forwarded-*`` are headers anyone who
  reaches a server can write. They are believed only on a connection whose verified TLS client
  certificate is the hub proxy's (:data:`tunehub_base.tls.PROXY_IDENTITY`: only the proxy holds
  that key, in the hub's root-only directory), and then only ``X-Real-Ip``, which the proxy sets
  to the address it accepted (``hub/proxy.py``); from anyone else (a notebook, a trial, anything
  on loopback, plain HTTP) the address is the connection's own. So the servers run without
  tornado's ``xheaders``.

Why here, in front of every route, rather than in each handler: a body is read and a JSON
document parsed on the server's one event loop, which also answers everyone else's requests and
every trial's reports. An 84 MiB body, or a JSON array of millions of numbers, held that loop for
seconds; JSON nested 100,000 deep blew the parser's recursion and answered 500.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import tornado.web
from tornado import httputil
from tornado.netutil import is_valid_ip

from tunehub_base import tls
from tunehub_base.options import setting

#: Bytes of a refused body read (and dropped) past the bound before its connection is closed.
DROP_AT_MOST = 2**30


@dataclass(frozen=True)
class RequestLimits:
    """The bounds of one request (see the module's docstring for why each exists)."""

    max_body: int = 32 * 2**20
    max_depth: int = 32
    max_items: int = 100_000
    #: The setting a refused body's answer names (the hub proxy has its own, larger bound).
    body_setting: str = "TUNEHUB_API_MAX_BODY"

    @classmethod
    def from_env(cls) -> RequestLimits:
        return cls(
            max_body=setting("TUNEHUB_API_MAX_BODY").number(),
            max_depth=setting("TUNEHUB_API_MAX_JSON_DEPTH").number(),
            max_items=setting("TUNEHUB_API_MAX_JSON_ITEMS").number(),
        )


class BodyError(ValueError):
    """A request body refused by a bound: ``status`` and a reason naming ``body``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_json(raw: bytes, limits: RequestLimits) -> Any:
    """``raw`` parsed, or a :class:`BodyError` (400) saying which bound or rule it broke."""
    items = raw.count(b",") + raw.count(b"[") + raw.count(b"{")
    if items > limits.max_items:
        raise BodyError(400, f"body: more than {limits.max_items} JSON values "
                        "(TUNEHUB_API_MAX_JSON_ITEMS)")
    try:
        value = json.loads(raw)
    except RecursionError:  # deeper than the interpreter's own recursion limit
        raise BodyError(400, _too_deep(limits)) from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BodyError(400, "body: not valid JSON") from None
    if depth_exceeds(value, limits.max_depth):
        raise BodyError(400, _too_deep(limits))
    return value


def _too_deep(limits: RequestLimits) -> str:
    return (f"body: JSON nested deeper than {limits.max_depth} levels "
            "(TUNEHUB_API_MAX_JSON_DEPTH)")


def depth_exceeds(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists and objects deeper than ``limit`` (walked without
    recursion, so the walk itself cannot blow the stack)."""
    stack = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def client_address(request_conn: httputil.HTTPConnection, headers: httputil.HTTPHeaders,
                   ) -> None:
    """Sets the address this request is known by (``request.remote_ip``): the connection's own,
    or, on the hub proxy's connection only, the ``X-Real-Ip`` the proxy set (module docstring).
    Set per request, since the proxy's kept-alive connection carries many clients' requests."""
    context = getattr(request_conn, "context", None)
    if context is None or not hasattr(context, "remote_ip"):
        return
    own = context.__dict__.setdefault("tunehub_peer_ip", context.remote_ip)
    stream = getattr(request_conn, "stream", None)
    forwarded = headers.get("X-Real-Ip", "").strip()
    if (forwarded and is_valid_ip(forwarded)
            and tls.peer_identity(getattr(stream, "socket", None)) == tls.PROXY_IDENTITY):
        context.remote_ip = forwarded
    else:
        context.remote_ip = own


class _BoundedBody(httputil.HTTPMessageDelegate):
    """Passes a request on to the application, unless its body is over the bound: then the
    body is read and dropped, and the answer is a 413 (see the module's docstring)."""

    def __init__(self, inner: httputil.HTTPMessageDelegate, conn: httputil.HTTPConnection,
                 max_body: int, body_setting: str = "TUNEHUB_API_MAX_BODY") -> None:
        self.inner, self.conn, self.max_body = inner, conn, max_body
        self.body_setting = body_setting
        self.received = 0
        self.refused = False
        self.answered = False

    def headers_received(
        self, start_line: httputil.RequestStartLine | httputil.ResponseStartLine,
        headers: httputil.HTTPHeaders,
    ) -> Any:
        client_address(self.conn, headers)
        try:
            declared = int(headers.get("Content-Length", "0"))
        except ValueError:
            declared = 0  # tornado itself refuses a malformed length
        # tornado's own limit, past which it answers a bare 400 and resets, is lifted: this
        # delegate judges every byte (and closes the connection past DROP_AT_MOST).
        set_limit = getattr(self.conn, "set_max_body_size", None)
        if set_limit is not None:
            set_limit(2**62)
        if declared > self.max_body:
            self.refused = True
            return None
        return self.inner.headers_received(start_line, headers)

    def data_received(self, chunk: bytes) -> Any:
        self.received += len(chunk)
        if self.refused:
            if self.received > self.max_body + DROP_AT_MOST and not self.answered:
                return self._answer_and_close()
            return None
        if self.received > self.max_body:  # a chunked body grown over the bound
            self.refused = True
            self.inner.on_connection_close()  # the handler never runs; its chunks are freed
            return None
        return self.inner.data_received(chunk)

    def finish(self) -> None:
        if not self.refused:
            self.inner.finish()
            return
        if not self.answered:
            self._answer()
            self.conn.finish()

    def _answer(self) -> Any:
        self.answered = True
        body = json.dumps({
            "status": 413, "field": "body",
            "error": f"body: larger than {self.max_body} bytes ({self.body_setting}); put "
                     "data in the data store",
        }).encode()
        headers = httputil.HTTPHeaders({"Content-Type": "application/json",
                                        "Content-Length": str(len(body))})
        return self.conn.write_headers(
            httputil.ResponseStartLine("HTTP/1.1", 413, "Content Too Large"), headers, body)

    async def _answer_and_close(self) -> None:
        """A refused body still arriving :data:`DROP_AT_MOST` bytes past the bound: answered
        now, and its connection closed once the answer is written."""
        await self._answer()
        close = getattr(self.conn, "close", None)
        if close is not None:
            close()

    def on_connection_close(self) -> None:
        if not self.refused:
            self.inner.on_connection_close()


class BoundedApplication(tornado.web.Application):
    """A tornado application whose every request body is bounded (:class:`_BoundedBody`); the
    limits are also its ``request_limits`` setting, where :func:`parse_json`'s callers find
    them."""

    def start_request(self, server_conn: object,
                      request_conn: httputil.HTTPConnection) -> httputil.HTTPMessageDelegate:
        limits: RequestLimits = self.settings["request_limits"]
        return _BoundedBody(super().start_request(server_conn, request_conn), request_conn,
                            limits.max_body, limits.body_setting)
