"""Gradual release in ``tunehub model serve``: a share of the production route's requests goes
to the ``canary`` version; after enough clean answers the canary takes production, and on an
error it is rolled back, each move written to the registry's history with its reason.

Which requests go to the canary is decided by a counter, not at random (request ``i`` goes
there when ``floor(i * share)`` steps up), so a share of 0.1 is exactly every tenth request and
a run is repeatable. An error is the model failing on a request TensorFlow Serving would
answer (not a request refused as malformed, a 400): the failed request is answered by the
production version, so a client never sees the canary's failure. Requests naming a version or
a label (``/labels/canary``) are not part of the release: they are served as asked.
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

    def goes_to_canary(self) -> bool:
        """Whether the next production-route request goes to the canary."""
        with self.lock:
            self.seen += 1
            share = self.policy.share
            return math.floor(self.seen * share) > math.floor((self.seen - 1) * share)

    def _track(self, version: int) -> None:
        if version != self.version:  # a new canary: its own counts
            self.version, self.clean, self.errors = version, 0, 0

    def answered(self, version: int) -> str | None:
        """A clean canary answer; the reason to roll it forward now, or None."""
        with self.lock:
            self._track(version)
            self.clean += 1
            if self.clean >= self.policy.promote_after:
                return (f"canary v{version}: {self.clean} requests answered, {self.errors} "
                        f"errors (at most {self.policy.max_errors} allowed)")
            return None

    def failed(self, version: int, error: str) -> str | None:
        """A canary error; the reason to roll it back now, or None."""
        with self.lock:
            self._track(version)
            self.errors += 1
            if self.errors > self.policy.max_errors:
                return (f"canary v{version} rolled back: {self.errors} errors in "
                        f"{self.clean + self.errors} requests; last: {error:.300}")
            return None
