"""Slowing down password guessing without handing anyone a way to lock someone else out.

Failures are counted per (account, client address): five wrong passwords for ``alice`` from an
attacker's address lock that address out of ``alice``, not ``alice`` herself, who still logs in
from her own. Each lockout of the same pair lasts twice the one before (``lockout_seconds``,
then 2×, 4×, … up to ``max_lockout_seconds``), so a patient guesser gets fewer tries per hour
the longer they try; a successful login from that address forgets its record.

The client address (:func:`client_address`) is the last entry of ``X-Forwarded-For`` not in
``c.JupyterHub.trusted_downstream_ips``: the proxy in front of the hub (``hub.proxy``, or the
Node.js configurable-http-proxy of the chart) appends the address it accepted the connection
from, so a client cannot choose its own: a forged ``X-Forwarded-For`` only adds entries before
it, and ``X-Real-Ip`` (which tornado would otherwise prefer, and the Node.js proxy passes on as
the client sent it) is not read. Behind a further load balancer, the operator lists it in
``trusted_downstream_ips`` (and has it append to ``X-Forwarded-For``), or every client shares
its address and one another's lockouts.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

#: Pairs remembered at most (the oldest are forgotten first), so spraying names and addresses
#: cannot grow the hub's memory without bound.
CAPACITY = 100_000


@dataclass
class _Record:
    failures: int = 0  # since the last lockout ended
    lockouts: int = 0
    until: float = 0.0  # monotonic time the current lockout ends


def client_address(request: Any, trusted: Collection[str] = ()) -> str:
    """The address a login came from, as the module's docstring says; the connection's own
    peer when no proxy forwarded it."""
    forwarded = [a.strip() for a in request.headers.get("X-Forwarded-For", "").split(",")]
    for address in reversed(forwarded):
        if address and address not in trusted:
            return address
    context = getattr(getattr(request, "connection", None), "context", None)
    return str(getattr(context, "_orig_remote_ip", None) or request.remote_ip or "")


class LoginThrottle:
    """Failed logins per (account, client address), with growing lockouts."""

    def __init__(self, max_failures: int, lockout_seconds: float,
                 max_lockout_seconds: float, capacity: int = CAPACITY) -> None:
        self.max_failures = max_failures
        self.lockout_seconds = lockout_seconds
        self.max_lockout_seconds = max_lockout_seconds
        self.capacity = capacity
        self._records: OrderedDict[tuple[str, str], _Record] = OrderedDict()

    def locked_for(self, account: str, client: str) -> float:
        """Seconds this pair is still locked out (0: it may try)."""
        record = self._records.get((account, client))
        if record is None:
            return 0.0
        return max(0.0, record.until - time.monotonic())

    def failed(self, account: str, client: str) -> None:
        key = (account, client)
        record = self._records.pop(key, None) or _Record()
        self._records[key] = record  # now the newest
        record.failures += 1
        if record.failures >= self.max_failures:
            lockout = min(self.lockout_seconds * 2 ** record.lockouts, self.max_lockout_seconds)
            record.until = time.monotonic() + lockout
            record.lockouts += 1
            record.failures = 0
        while len(self._records) > self.capacity:
            self._records.popitem(last=False)

    def succeeded(self, account: str, client: str) -> None:
        self._records.pop((account, client), None)
