"""Gradual release in ``tunehub model serve``: a share of the production route's requests goes
to the ``canary`` version; after enough clean answers the canary takes production, and on an
error it is rolled back, each move written to the registry's history with its reason.

Which requests go to the canary is decided by a counter, not at random (request ``i`` goes
there when ``floor(i * share)`` steps up), so a share of 0.1 is exactly every tenth request and
a run is repeatable. A canary is judged on its latency too, where a bound is given: when it has
answered enough requests to move, its p95 latency (measured by the server around the model's
call, the same span for every version) must be within ``max_p95_ms`` or it is rolled back
instead, with both figures in the reason. An error is the model failing on a request
TensorFlow Serving would answer (not a request refused as malformed, a 400): the failed request
is answered by the production version, so a client never sees the canary's failure. Requests
naming a version or a label (``/labels/canary``) are not part of the release: they are served
as asked.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass

log = logging.getLogger("tunehub.canary")


@dataclass(frozen=True)
class CanaryPolicy:
    """How a canary is released (``model serve --canary-share/--canary-requests``)."""

    share: float = 0.1
    #: Clean canary answers after which the canary takes production.
    promote_after: int = 100
    #: Errors tolerated before it is rolled back (0: the first one rolls it back).
    max_errors: int = 0
    #: The canary's p95 latency (ms) over its answers must be within this to take production.
    max_p95_ms: float | None = None


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
    lines = [line.strip() for line in str(exc).splitlines()]
    said = [line for line in lines if line and not line.startswith(_NOISE)]
    return f"{type(exc).__name__}: {(said or lines or [''])[0]}"


class CanaryRelease:
    """The counters of the current canary version, and the decisions they lead to."""

    def __init__(self, policy: CanaryPolicy) -> None:
        if not 0 < policy.share <= 1:
            raise ValueError(f"canary share: expected a number in (0, 1], got {policy.share}")
        self.policy = policy
        self.lock = threading.Lock()
        self.seen = 0
        self.version: int | None = None
        self.clean = 0
        self.errors = 0
        self.latencies: list[float] = []

    def goes_to_canary(self) -> bool:
        """Whether the next production-route request goes to the canary."""
        with self.lock:
            self.seen += 1
            share = self.policy.share
            return math.floor(self.seen * share) > math.floor((self.seen - 1) * share)

    def _track(self, version: int) -> None:
        if version != self.version:  # a new canary: its own counts
            self.version, self.clean, self.errors = version, 0, 0
            self.latencies = []

    def answered(self, version: int, seconds: float) -> CanaryMove | None:
        """A clean canary answer that took ``seconds``; the move it leads to now, or None."""
        with self.lock:
            self._track(version)
            self.clean += 1
            self.latencies.append(seconds * 1000)
            if self.clean < self.policy.promote_after:
                return None
            said = (f"canary v{version}: {self.clean} requests answered, {self.errors} "
                    f"errors (at most {self.policy.max_errors} allowed)")
            bound = self.policy.max_p95_ms
            if bound is None:
                return CanaryMove(True, said)
            p95 = _p95(self.latencies)
            if p95 > bound:
                return CanaryMove(False, f"canary v{version} rolled back: p95 latency "
                                         f"{p95:.1f} ms over {self.clean} requests is over the "
                                         f"bound of {bound:g} ms")
            return CanaryMove(True, f"{said}, p95 latency {p95:.1f} ms (at most {bound:g} ms)")

    def failed(self, version: int, error: str) -> CanaryMove | None:
        """A canary error; the move back it leads to now, or None."""
        with self.lock:
            self._track(version)
            self.errors += 1
            if self.errors > self.policy.max_errors:
                return CanaryMove(False, f"canary v{version} rolled back: {self.errors} errors "
                                         f"in {self.clean + self.errors} requests; last: "
                                         f"{error:.300}")
            return None


def _p95(values: list[float]) -> float:
    """The nearest-rank 95th percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]
