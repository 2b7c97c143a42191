"""The proxy ``tunehub up`` runs: configurable-http-proxy from PyPI (no Node.js), with two fixes
to its websocket handling, both needed by JupyterLab's kernel connections:

- it does not answer with the subprotocol the backend chose. JupyterLab offers
  ``v1.kernel.websocket.jupyter.org``; a browser that offered a subprotocol and got none back
  fails the handshake, JupyterLab reconnects, and a cell run meanwhile is silently never sent;
- it forwards the client's binary frames to the backend as text frames, which breaks the v1
  kernel protocol (binary messages) once the subprotocol is agreed.

The Node.js proxy does both right; these overrides do what it does.

Run as ``python -m hub.proxy`` with configurable-http-proxy's own command-line options.
"""

from __future__ import annotations

from typing import Any

from configurable_http_proxy import cli
from configurable_http_proxy.configproxy import PythonProxy
from configurable_http_proxy.handlers import ProxyHandler
from tornado.web import Application


class WebsocketFixProxyHandler(ProxyHandler):
    """Answers a websocket upgrade with the backend's subprotocol; keeps binary frames binary."""

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
    """configurable-http-proxy whose public app uses :class:`WebsocketFixProxyHandler`."""

    def __init__(self, options: Any = ()) -> None:
        super().__init__(options)
        self.proxy_app = Application([(r"/(.*)", WebsocketFixProxyHandler, {"proxy": self})])


def main() -> None:
    cli.PythonProxy = TunehubProxy  # the CLI builds its proxy from this module-level name
    cli.main()


if __name__ == "__main__":
    main()
