"""When the database goes away for a while (a crash, a failover, a restart for an upgrade).

One rule says what "the database is unreachable" means (:func:`unreachable`), and everything
else asks it: the retry below, the API's answer (503 with ``Retry-After``), the CLI's one line.

Who waits and who answers at once is a property of the caller, not of the ledger call: a
controller (its loop, its heartbeat, the worker threads it starts) waits the outage out, since
giving up would leave its sweep ``running`` with nobody driving it; a request handler answers
503 at once and its client retries (the trial SDK's report does), since a handler that waited
would hold the caller's connection for minutes. :func:`waiting_out_outages` marks the former in
a context variable, which asyncio tasks and ``asyncio.to_thread`` inherit.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from functools import wraps
from typing import ParamSpec, TypeVar

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from tunehub_base.outage import OUTAGE_SECONDS, RETRY_AFTER_SECONDS
from tuner.errors import Unavailable

__all__ = [
    "DatabaseUnavailable",
    "off_the_loop_while_down",
    "once_reachable",
    "RETRY_AFTER_SECONDS",
    "OUTAGE_SECONDS",
    "note_reachable",
    "note_unreachable",
    "patient",
    "unreachable",
    "waiting_out_outages",
]

log = logging.getLogger("tunehub.db")

# OUTAGE_SECONDS (how long a waiting caller waits in all) and RETRY_AFTER_SECONDS (a 503's
# Retry-After) are the floor's (tunehub_base.outage): the notebook client and the trial SDK
# wait out the same outage without importing this module.
_FIRST_DELAY, _MAX_DELAY = 0.5, 5.0

P = ParamSpec("P")
R = TypeVar("R")

_waits: contextvars.ContextVar[bool] = contextvars.ContextVar("tunehub_db_waits", default=False)


class DatabaseUnavailable(Unavailable):
    """The database cannot be reached now; the same request may work in a moment."""


def unreachable(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an error it was raised from: Optuna wraps SQLAlchemy's) means the
    database cannot be reached, as opposed to a bad statement or a lock: a connection that
    was lost or refused (SQLAlchemy's ``connection_invalidated``, ``InterfaceError``), or
    PostgreSQL's ``OperationalError`` with no SQL state or one of the connection classes
    (``08``: connection exception, ``57P``: the server shutting down or starting up).
    SQLite's ``OperationalError`` (a locked database) is not an outage."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DatabaseUnavailable):
            return True
        if isinstance(exc, DBAPIError):
            if exc.connection_invalidated or isinstance(exc, InterfaceError):
                return True
            if isinstance(exc, OperationalError) and _lost_connection(exc.orig):
                return True
        exc = exc.__cause__ or exc.__context__
    return False


def busy(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an error it was raised from) is SQLite's "database is locked": a
    writer held the file longer than the busy timeout. Not an outage (nothing is away, so it
    is not said as one), but a fault of the database all the same: the caller is told to ask
    again (503 with ``Retry-After``), never answered a 500."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        orig = getattr(exc, "orig", None)
        if isinstance(exc, OperationalError) and orig is not None and \
                type(orig).__module__.startswith("sqlite3") and (
                    "locked" in str(orig) or "busy" in str(orig)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _lost_connection(orig: BaseException | None) -> bool:
    if orig is None or type(orig).__module__.startswith("sqlite3"):
        return False
    state = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return state is None or state.startswith(("08", "57P"))


class _Outage:
    """Says once that the database went away, and once that it came back."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.since: float | None = None

    def failed(self) -> None:
        with self.lock:
            if self.since is not None:
                return
            self.since = time.time()
        _say(f"database unreachable since "
             f"{datetime.fromtimestamp(self.since).strftime('%H:%M:%S')}, retrying")

    def succeeded(self) -> None:
        if self.since is None:
            return
        with self.lock:
            since, self.since = self.since, None
        if since is not None:
            _say(f"database reachable again after {time.time() - since:.0f} s; carrying on")


def _say(message: str) -> None:
    """A warning in plain words: the CLI shows it on stderr, the service in its log."""
    log.warning(message)


_outage = _Outage()


def note_unreachable() -> None:
    """The database was found unreachable (said once per outage)."""
    _outage.failed()


def note_reachable() -> None:
    """The database answered (the outage, if one was said, is said to be over)."""
    _outage.succeeded()


@contextmanager
def waiting_out_outages(wait: bool = True) -> Iterator[None]:
    """Within this block (and tasks and threads started from it) :func:`patient` calls wait
    for the database instead of raising (``wait=False``: raise, for a moment)."""
    token = _waits.set(wait)
    try:
        yield
    finally:
        _waits.reset(token)


def waited(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """``fn`` (one whole transaction, :func:`patient`'s rule) called now, waiting a database
    outage out whatever the caller's setting: for callers that can only wait (a CLI command,
    a process starting)."""
    with waiting_out_outages():
        return patient(fn)(*args, **kwargs)


async def off_the_loop_while_down(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """``fn`` (a :func:`patient` call) on the event loop as usual; while the database is
    unreachable, waited out in a worker thread instead, so that the loop's other work goes
    on meanwhile: the API answering 503, trials' exits, the other sweeps of the process."""
    with waiting_out_outages(False):
        try:
            return fn(*args, **kwargs)
        except DatabaseUnavailable:
            pass
    return await asyncio.to_thread(fn, *args, **kwargs)


async def once_reachable(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """``fn`` (a quick call that must run on the event loop, e.g. one that starts a task, and
    raises :class:`DatabaseUnavailable` during an outage) called again with backoff on the
    loop's clock until the database answers: what starts a controller (the service adopting
    its sweeps, the CLI driving one) waits an outage out instead of dying with it, and the
    loop serves meanwhile. Gives up after :data:`OUTAGE_SECONDS`, like :func:`patient`."""
    deadline = time.monotonic() + OUTAGE_SECONDS
    delay = _FIRST_DELAY
    while True:
        with waiting_out_outages(False):
            try:
                return fn(*args, **kwargs)
            except DatabaseUnavailable:
                if time.monotonic() > deadline:
                    raise
        await asyncio.sleep(delay)  # backoff between retries of a lost connection
        delay = min(delay * 2, _MAX_DELAY)


def patient(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` (one whole database transaction) retried with backoff while the database is
    unreachable, for callers that wait; for the others, the outage raised as
    :class:`DatabaseUnavailable`.

    ``fn`` must be idempotent, not merely safe to run again after a failure: a connection
    lost while ``COMMIT`` is answered leaves a transaction that did commit and a caller that
    cannot tell, and the retry then runs it a second time. So each write first looks for its
    own effect in the same transaction (the ledger's) or asks before trying again (the Optuna
    mirror's, :meth:`tuner.search.mirror.StudyMirror.write`)."""

    @wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        deadline: float | None = None
        delay = _FIRST_DELAY
        while True:
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:
                if not unreachable(exc):
                    raise
                _outage.failed()
                if not _waits.get():
                    raise DatabaseUnavailable("database unreachable; retry shortly") from exc
                if deadline is None:
                    deadline = time.monotonic() + OUTAGE_SECONDS
                if time.monotonic() > deadline:
                    raise DatabaseUnavailable(
                        f"database unreachable for over {OUTAGE_SECONDS:.0f} s") from exc
                time.sleep(delay)  # backoff between retries of a lost connection
                delay = min(delay * 2, _MAX_DELAY)
                continue
            _outage.succeeded()
            return result

    return call
