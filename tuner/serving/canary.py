"""Gradual release in ``tunehub model serve``: a share of the production route's requests goes
to the ``canary`` version; after enough clean answers, or enough time, the canary takes
production, and on an error it is rolled back, each move written to the registry's history with
its reason.

Which requests go to the canary is decided by a counter, not at random (request ``i`` goes
there when ``floor(i * share)`` steps up), so a share of 0.1 is exactly every tenth request and
a run is repeatable.

**When it moves.** A canary is judged when it has answered ``promote_after`` requests cleanly,
or, with ``promote_after_seconds``, once that many seconds have passed since it took its first
request and it has answered at least one cleanly, whichever comes first (the time is judged by
the server's clock as well as on each answer, so a canary whose traffic stops still moves).
Then its bounds decide the direction: its p95 latency (measured by the server around the
model's call, the same span for every version) must be within ``max_p95_ms``, and its error
rate (errors over the requests it took) within ``max_error_rate``, or it is rolled back instead,
with the figures and the bound in the reason.

**Errors.** An error is the model failing on a request TensorFlow Serving would answer (not a
request refused as malformed, a 400): the failed request is answered by the production version,
so a client never sees the canary's failure. ``max_errors`` is judged at once: one error more
rolls the canary back at that request (None: no count bound, as when only a rate is given).
Requests naming a version or a label (``/labels/canary``) are not part of the release: they are
served as asked.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("tunehub.canary")


@dataclass(frozen=True)
class CanaryPolicy:
    """How a canary is released (``model serve --canary-share/--canary-requests/
    --canary-seconds/--canary-errors/--canary-error-rate/--canary-latency-ms``)."""

    share: float = 0.1
    #: Clean canary answers after which the canary is judged (and takes production if within
    #: its bounds).
    promote_after: int = 100
    #: Errors tolerated before it is rolled back (0: the first one rolls it back; None: no
    #: count bound).
    max_errors: int | None = 0
    #: The canary's p95 latency (ms) over its answers must be within this to take production.
    max_p95_ms: float | None = None
    #: Seconds since the canary's first request after which it is judged (with at least one
    #: clean answer), if ``promote_after`` answers have not come first.
    promote_after_seconds: float | None = None
    #: Errors over the requests the canary took, a fraction: it must be within this to take
    #: production.
    max_error_rate: float | None = None


@dataclass(frozen=True)
class CanaryMove:
    """What the counters decided: roll the canary ``forward`` to production, or back."""

    forward: bool
    reason: str


_NOISE = ("File ", "Detected at node", "Graph execution error", "[[", "[Op:", "<stack traces")


def describe_error(exc: BaseException) -> str:
    """One line for a model's failure: TensorFlow's graph errors start with "Graph execution
    error" and a traceback of where the op was defined; the line that says what failed comes
    after them."""
    return f"{type(exc).__name__}: {first_line(str(exc))}"


def first_line(text: str) -> str:
    """The line of a TensorFlow error message that says what failed (as TensorFlow Serving's
    answers carry it too), without the traceback lines around it."""
    lines = [line.strip() for line in text.splitlines()]
    said = [line for line in lines if line and not line.startswith(_NOISE)]
    return (said or lines or [""])[0]


class CanaryRelease:
    """The counters of the current canary version, and the decisions they lead to. A version
    is decided once: after a move, its later answers lead to none (until a new canary)."""

    def __init__(self, policy: CanaryPolicy,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 < policy.share <= 1:
            raise ValueError(f"canary share: expected a number in (0, 1], got {policy.share}")
        if policy.max_error_rate is not None and not 0 <= policy.max_error_rate < 1:
            raise ValueError(f"canary error rate: expected a fraction in [0, 1), got "
                             f"{policy.max_error_rate}")
        self.policy = policy
        self.clock = clock
        self.lock = threading.Lock()
        self.seen = 0
        self.version: int | None = None
        self.started = 0.0
        self.decided = False
        self.clean = 0
        self.errors = 0
        self.latencies: list[float] = []

    def goes_to_canary(self) -> bool:
        """Whether the next production-route request goes to the canary."""
        with self.lock:
            self.seen += 1
            share = self.policy.share
            return math.floor(self.seen * share) > math.floor((self.seen - 1) * share)

    def routed(self, version: int) -> None:
        """A request was sent to canary ``version``: its time starts at the first one."""
        with self.lock:
            self._track(version)

    def _track(self, version: int) -> None:
        if version != self.version:  # a new canary: its own counts and clock
            self.version, self.clean, self.errors = version, 0, 0
            self.latencies = []
            self.started = self.clock()
            self.decided = False

    def answered(self, version: int, seconds: float) -> CanaryMove | None:
        """A clean canary answer that took ``seconds``; the move it leads to now, or None."""
        with self.lock:
            self._track(version)
            self.clean += 1
            self.latencies.append(seconds * 1000)
            return self._judge()

    def failed(self, version: int, error: str) -> CanaryMove | None:
        """A canary error; the move it leads to now, or None."""
        with self.lock:
            self._track(version)
            self.errors += 1
            bound = self.policy.max_errors
            if not self.decided and bound is not None and self.errors > bound:
                self.decided = True
                return CanaryMove(False, f"canary v{version} rolled back: {self.errors} errors "
                                         f"in {self.clean + self.errors} requests; last: "
                                         f"{error:.300}")
            return self._judge()

    def due(self) -> CanaryMove | None:
        """The move the clock leads to now (``promote_after_seconds``), or None: what the
        server asks between requests."""
        with self.lock:
            return self._judge() if self.version is not None else None

    def reopen(self, version: int) -> None:
        """A move of ``version`` could not be carried out: judge it again later."""
        with self.lock:
            if version == self.version:
                self.decided = False

    def forget(self, version: int) -> None:
        """``version`` was moved (or is no longer the canary): a later canary of the same
        number starts afresh."""
        with self.lock:
            if version == self.version:
                self.version = None

    def _judge(self) -> CanaryMove | None:
        """The move the current counts lead to (under the lock), or None; at most once."""
        policy, version = self.policy, self.version
        if self.decided or version is None:
            return None
        elapsed = self.clock() - self.started
        by_count = self.clean >= policy.promote_after
        by_time = (policy.promote_after_seconds is not None and self.clean >= 1
                   and elapsed >= policy.promote_after_seconds)
        if not (by_count or by_time):
            return None
        self.decided = True
        taken = self.clean + self.errors
        if by_count:
            said = f"canary v{version}: {self.clean} requests answered"
        else:
            said = (f"canary v{version}: {elapsed:.1f} s of traffic (at least "
                    f"{policy.promote_after_seconds:g} s), {self.clean} requests answered")
        said += f", {self.errors} errors"
        if policy.max_errors is not None:
            said += f" (at most {policy.max_errors} allowed)"
        rate_bound = policy.max_error_rate
        if rate_bound is not None:
            rate = self.errors / taken
            if rate > rate_bound:
                return CanaryMove(False, f"canary v{version} rolled back: error rate "
                                         f"{rate:.1%} ({self.errors} errors in {taken} "
                                         f"requests) is over the bound of {rate_bound:.1%}")
            said += f", error rate {rate:.1%} (at most {rate_bound:.1%})"
        bound = policy.max_p95_ms
        if bound is None:
            return CanaryMove(True, said)
        p95 = _p95(self.latencies)
        if p95 > bound:
            return CanaryMove(False, f"canary v{version} rolled back: p95 latency "
                                     f"{p95:.1f} ms over {self.clean} requests is over the "
                                     f"bound of {bound:g} ms")
        return CanaryMove(True, f"{said}, p95 latency {p95:.1f} ms (at most {bound:g} ms)")


def _p95(values: list[float]) -> float:
    """The nearest-rank 95th percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]
