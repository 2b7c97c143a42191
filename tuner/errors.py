"""Errors whose message is meant for the user. The CLI prints them as one line; the API turns
them into 4xx JSON (``status``)."""

from __future__ import annotations


class TunehubError(Exception):
    """Base for errors caused by the request, not by tunehub. ``status`` is the HTTP code."""

    status = 400


class NotFound(TunehubError, LookupError):
    """No such thing, or not yours (the same answer, so ids leak nothing)."""

    status = 404


class Conflict(TunehubError, ValueError):
    """The request is valid but not in the object's current state."""

    status = 409


class Unauthorized(TunehubError, PermissionError):
    """Missing or wrong credentials."""

    status = 401


class Forbidden(TunehubError, PermissionError):
    """Known caller, not allowed (e.g. a token without the needed scope)."""

    status = 403


class Unavailable(TunehubError):
    """Not now: the same request may work in a moment (503 with ``Retry-After``)."""

    status = 503
