"""SQLite held by a writer past the busy timeout is a fault of the database, not of the
request: the API answers 503 with ``Retry-After`` and a JSON reason, never a 500, and it is
not taken for an outage (nothing is away)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.exc import OperationalError
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets
from tornado.web import Application

from tuner.api.base import JsonHandler
from tuner.db.outage import busy, unreachable


@pytest.fixture
def locked_database(tmp_path: Path) -> Iterator[sa.Engine]:
    """A SQLite file one connection holds a write transaction on, and an engine on it that
    waits no time for the lock."""
    path = tmp_path / "held.sqlite"
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("CREATE TABLE t (x INTEGER)")
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("INSERT INTO t VALUES (1)")
    engine = sa.create_engine(f"sqlite:///{path}", connect_args={"timeout": 0})
    try:
        yield engine
    finally:
        engine.dispose()
        writer.execute("ROLLBACK")
        writer.close()


def _write(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO t VALUES (2)"))


def test_a_locked_sqlite_database_is_busy_not_away(locked_database: sa.Engine) -> None:
    with pytest.raises(OperationalError) as raised:
        _write(locked_database)
    assert busy(raised.value) and not unreachable(raised.value)
    wrapped = RuntimeError("a caller's wrapper")
    wrapped.__cause__ = raised.value
    assert busy(wrapped)  # (Optuna wraps SQLAlchemy's errors)
    assert not busy(ValueError("database is locked"))  # only the database's own error


async def test_the_api_answers_503_with_retry_after(locked_database: sa.Engine) -> None:
    class Writes(JsonHandler):
        def post(self) -> None:
            _write(locked_database)
            self.send({"ok": True})

    server = HTTPServer(Application([(r"/write", Writes)]))
    sock = bind_sockets(0, "127.0.0.1")
    server.add_sockets(sock)
    port = sock[0].getsockname()[1]
    try:
        async with httpx.AsyncClient() as client:
            r = await client.post(f"http://127.0.0.1:{port}/write", content=b"{}")
    finally:
        server.stop()
    assert r.status_code == 503, r.text
    assert r.headers["Retry-After"] and r.json() == {
        "status": 503, "error": "the database is busy; retry shortly"}
