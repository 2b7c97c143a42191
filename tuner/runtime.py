"""An engine with its report API on loopback, in this process: how the CLI runs sweeps on one
machine without the hub. The hub's tuner service builds the same engine behind the proxy."""

from __future__ import annotations

import socket
from types import TracebackType

from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from tunehub_base.settings import Settings
from tuner.api import make_app
from tuner.backends import make_backend
from tuner.db import Database
from tuner.scheduling.host import SweepHost


class LocalRuntime:
    """``async with LocalRuntime(settings, db, ["local"]) as engine: ...``"""

    def __init__(self, settings: Settings, db: Database, backends: list[str]) -> None:
        self.settings = settings
        self.db = db
        self.backend_names = backends
        self.server: HTTPServer | None = None
        self.engine: SweepHost | None = None

    async def __aenter__(self) -> SweepHost:
        sockets = bind_sockets(0, "127.0.0.1", family=socket.AF_INET)
        port = sockets[0].getsockname()[1]
        backends = {name: make_backend(name, self.settings) for name in self.backend_names}
        self.engine = SweepHost(self.db, self.settings, backends, f"http://127.0.0.1:{port}/")
        self.server = HTTPServer(make_app(self.engine))
        self.server.add_sockets(sockets)
        await self.engine.start()
        return self.engine

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.engine is not None:
            await self.engine.close()
        if self.server is not None:
            self.server.stop()
            await self.server.close_all_connections()
