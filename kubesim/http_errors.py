"""Kubernetes ``Status`` objects: every error the emulator returns is one, like a real server."""

from __future__ import annotations

from aiohttp import web

from .objects import JSON


class ApiError(Exception):
    """Raised by handlers; rendered as a ``Status`` JSON body with ``code``."""

    def __init__(self, code: int, reason: str, message: str, details: JSON | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details


def status_body(code: int, reason: str, message: str, details: JSON | None = None) -> JSON:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}
    if details:
        body["details"] = details
    return body


def error_response(err: ApiError) -> web.Response:
    return web.json_response(status_body(err.code, err.reason, err.message, err.details),
                             status=err.code)


def not_found(plural: str, group: str, name: str) -> ApiError:
    qual = f"{plural}.{group}" if group else plural
    return ApiError(404, "NotFound", f'{qual} "{name}" not found',
                    {"name": name, "group": group, "kind": plural})


def success(plural: str, group: str, name: str, uid: str | None = None) -> JSON:
    details = {"name": name, "group": group, "kind": plural}
    if uid:
        details["uid"] = uid
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "details": details}
