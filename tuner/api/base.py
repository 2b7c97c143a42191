"""JSON request handling shared by every endpoint: errors are JSON with a reason, never a
traceback or a bare 500."""

from __future__ import annotations

import json
import logging
from typing import Any

from tornado.web import HTTPError, RequestHandler

from tunehub_base.request_bounds import BodyError, RequestLimits, parse_json
from tuner.db.outage import (
    RETRY_AFTER_SECONDS,
    DatabaseUnavailable,
    busy,
    note_reachable,
    note_unreachable,
    unreachable,
)
from tuner.errors import NotFound, TunehubError, Unavailable
from tuner.spec import SpecError

log = logging.getLogger("tunehub.api")

# Ids are 32-bit integer columns: a larger number names nothing (and must not reach the
# database, whose driver would raise OverflowError).
MAX_ID = 2**31 - 1


def parse_id(raw: str, not_found: str) -> int:
    """A path segment as an id, or a 404 saying what was not found."""
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_ID:
        raise NotFound(not_found)
    return value


class ApiError(HTTPError):
    """An error whose message is meant for the caller."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(status, reason=None)
        self.message = message
        self.field = field


class JsonHandler(RequestHandler):
    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json")

    def json_body(self) -> dict[str, Any]:
        """The body as a JSON object, within the service's bounds
        (:mod:`tunehub_base.request_bounds`)."""
        limits: RequestLimits = self.settings.get("request_limits") or RequestLimits()
        try:
            body = parse_json(self.request.body or b"{}", limits)
        except BodyError as exc:
            raise ApiError(exc.status, str(exc), "body") from None
        if not isinstance(body, dict):
            raise ApiError(400, "body: must be a JSON object", "body")
        return body

    def send(self, payload: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(payload, default=str))

    def _handle_request_exception(self, e: BaseException) -> None:
        # The database away for a while: 503, and when to ask again (tuner.db.outage).
        if unreachable(e) and not self._finished:
            note_unreachable()
            if not isinstance(e, DatabaseUnavailable):
                e = DatabaseUnavailable("database unreachable; retry shortly")
        elif busy(e) and not self._finished:  # SQLite held by a writer past its timeout
            e = Unavailable("the database is busy; retry shortly")
        # Domain errors are the caller's mistake: answer their status, not a 500.
        if isinstance(e, TunehubError) and not self._finished:
            log.info("%s %s -> %s: %s", self.request.method, self.request.path, e.status, e)
            self.send_error(e.status, exc_info=(type(e), e, e.__traceback__))
            return
        super()._handle_request_exception(e)

    def on_finish(self) -> None:
        if self.get_status() < 500:  # answered: the database, if it was away, is back
            note_reachable()

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        body: dict[str, Any] = {"status": status_code}
        if isinstance(exc, Unavailable):  # (send_error cleared the headers before)
            self.set_header("Retry-After", str(RETRY_AFTER_SECONDS))
        if isinstance(exc, ApiError):
            body["error"] = exc.message
            if exc.field:
                body["field"] = exc.field
        elif isinstance(exc, TunehubError):
            body["error"] = str(exc)
            if isinstance(exc, SpecError):
                body["field"] = exc.field
        elif isinstance(exc, HTTPError) and status_code < 500:
            body["error"] = exc.log_message or self._reason
        elif status_code < 500:
            body["error"] = self._reason
        else:
            body["error"] = "internal error; see the tuner service log"
        self.finish(json.dumps(body))


class NotFoundHandler(JsonHandler):
    """What answers a path no route matches."""

    def prepare(self) -> None:
        raise ApiError(404, f"no such endpoint: {self.request.path[:200]}")
