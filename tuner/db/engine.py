"""Engine set-up and migrations.

SQLite gets WAL and a busy timeout so the CLI can read while a controller process writes.
Migrations run on open (``alembic upgrade head``) with their own version table, since Optuna
keeps its own ``alembic_version`` in the same database.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from tuner.db.outage import waited

MIGRATIONS = Path(__file__).parent / "migrations"
VERSION_TABLE = "tunehub_alembic_version"


def ours(name: str | None, type_: str, parent_names: object) -> bool:
    """Alembic's ``include_name``: only tunehub's tables, never Optuna's beside them."""
    return type_ != "table" or bool(name and name.startswith("tunehub_"))


def engine_kwargs(url: str) -> dict[str, Any]:
    """Connection options shared by our engine and Optuna's RDBStorage."""
    if url.startswith("sqlite"):
        return {"connect_args": {"timeout": 30}}
    return {"pool_pre_ping": True}


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def tune_sqlite(engine: Engine) -> None:
    """WAL, ``synchronous=NORMAL`` and foreign keys on every connection of ``engine`` (a
    no-op for other databases). Optuna's engine gets them too: its writes share the database
    with ours, and with SQLite's default (``FULL``) each of its commits waits for an fsync
    (two per trial, on the controller's path) where ours do not."""
    if engine.dialect.name != "sqlite":
        return
    event.listen(engine, "connect", _sqlite_pragmas)
    if engine.url.database not in (None, "", ":memory:"):
        # Connections opened before the listener reopen with the pragmas (an in-memory
        # database would be lost with its connection: it keeps the defaults).
        engine.dispose()


class Database:
    """Owns the engine and hands out sessions. ``Database(url)`` migrates to head."""

    def __init__(self, url: str, migrate: bool = True) -> None:
        self.url = url
        if url.startswith("sqlite:///"):
            Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        self.engine: Engine = create_engine(url, **engine_kwargs(url))
        tune_sqlite(self.engine)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        if migrate:
            try:
                self.migrate()
            except BaseException:
                self.engine.dispose()  # (a retry after an outage opens a new one)
                raise

    @classmethod
    def when_reachable(cls, url: str) -> Database:
        """``Database(url)``, waiting out an outage (with backoff, said once in the log) instead
        of failing: a process that starts while its database is down (the tuner service after a
        machine's reboot, a failover in progress) comes up when it returns, not in a crash loop."""
        return waited(cls, url)

    def migrate(self) -> None:
        from alembic import command
        from alembic.config import Config

        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        cfg.set_main_option("sqlalchemy.url", self.url.replace("%", "%%"))
        with self.engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session that commits on success and rolls back on error."""
        with self._sessions() as session:
            try:
                yield session
                session.commit()
            except BaseException:
                session.rollback()
                raise

    def dispose(self) -> None:
        self.engine.dispose()
