"""Faults the emulator injects on request, the way a real API server misbehaves under load, in
an upgrade or behind a flaky load balancer: error answers (500, 503, 429 with ``Retry-After``),
slow answers, an answer lost after the request was applied (the client sees a 500 though the
object was created), a watch that ends at once or answers 410 Gone.

Only the client's requests are affected, never the harness's (the test's own reads). A test
adds rules and the emulator takes the first that matches each request::

    kube.faults.inject(503, verb="create", resource="jobs", times=2, retry_after=1)
    kube.faults.inject(500, verb="create", resource="secrets", applied=True)   # answer lost
    kube.faults.inject(0, verb="list", resource="pods", delay=3.0)            # slow only
    kube.faults.inject(0, verb="watch", resource="jobs", times=5)             # ends at once
    kube.faults.inject(410, verb="watch", resource="pods")                    # Gone
    kube.faults.hits("create", "jobs")    # how many requests a rule answered
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from aiohttp import web

from .http_errors import ApiError, error_response

REASONS = {429: "TooManyRequests", 410: "Expired", 500: "InternalError",
           502: "BadGateway", 503: "ServiceUnavailable", 504: "Timeout"}


@dataclass
class Fault:
    """One rule: ``status`` 0 answers normally (after ``delay``; a watch ends at once)."""

    status: int
    verb: str | None = None  # get, list, watch, create, update, patch, delete; None: any
    resource: str | None = None  # plural ("jobs", "pods/status"); None: any
    times: int = 1  # requests it answers before it is spent
    delay: float = 0.0  # seconds before the answer
    retry_after: int | None = None  # the ``Retry-After`` header of an error answer
    applied: bool = False  # the request is carried out, then its answer is the error
    hits: int = 0
    waited: int = 0  # requests whose delay is over (a test waits for its slow requests)

    @property
    def reason(self) -> str:
        return REASONS.get(self.status, "InternalError")

    def matches(self, verb: str, resource: str) -> bool:
        return (self.hits < self.times and self.verb in (None, verb)
                and self.resource in (None, resource))


class Faults:
    """The rules a test injected; thread-safe (the test and the emulator's loop use it)."""

    def __init__(self) -> None:
        self._rules: list[Fault] = []
        self._lock = threading.Lock()

    def inject(self, status: int, *, verb: str | None = None, resource: str | None = None,
               times: int = 1, delay: float = 0.0, retry_after: int | None = None,
               applied: bool = False) -> Fault:
        fault = Fault(status, verb, resource, times, delay, retry_after, applied)
        with self._lock:
            self._rules.append(fault)
        return fault

    def take(self, verb: str, resource: str) -> Fault | None:
        """The rule that answers this request (counted as a hit), if any."""
        with self._lock:
            for fault in self._rules:
                if fault.matches(verb, resource):
                    fault.hits += 1
                    return fault
        return None

    def hits(self, verb: str | None = None, resource: str | None = None) -> int:
        with self._lock:
            return sum(f.hits for f in self._rules
                       if verb in (None, f.verb) and resource in (None, f.resource))

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()


class InjectedFault(Exception):
    """Raised in the emulator's dispatch to answer with ``fault`` at once."""

    def __init__(self, fault: Fault) -> None:
        super().__init__(fault.reason)
        self.fault = fault


def fault_response(fault: Fault) -> web.Response:
    """The ``Status`` a real server sends for this code, with ``Retry-After`` if set."""
    response = error_response(ApiError(fault.status, fault.reason,
                                       f"injected fault: {fault.status} {fault.reason}"))
    if fault.retry_after is not None:
        response.headers["Retry-After"] = str(fault.retry_after)
    return response
