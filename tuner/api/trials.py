"""The trial report endpoint: per-trial tokens only, answers the pruning decision."""

from __future__ import annotations

import math

from tuner.api.base import ApiError, JsonHandler
from tuner.controller import Engine


class ReportHandler(JsonHandler):
    def initialize(self, engine: Engine) -> None:
        self.engine = engine

    def post(self, trial_id: str) -> None:
        auth = self.request.headers.get("Authorization", "")
        if not auth.startswith("Bearer ") or not auth[7:].strip():
            raise ApiError(401, "a trial token is required (Authorization: Bearer ...)")
        body = self.json_body()
        value = body.get("value")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
            value
        ):
            raise ApiError(400, f"value: expected a finite number, got {value!r}", "value")
        step = body.get("step")
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
            raise ApiError(400, f"step: expected a non-negative integer, got {step!r}", "step")
        attempt = body.get("attempt", 1)
        if isinstance(attempt, bool) or not isinstance(attempt, int):
            raise ApiError(400, f"attempt: expected an integer, got {attempt!r}", "attempt")
        last = body.get("last", False)
        if not isinstance(last, bool):
            raise ApiError(400, f"last: expected true or false, got {last!r}", "last")
        prune = self.engine.report(
            int(trial_id), auth[7:].strip(), attempt, float(value), step, last=last
        )
        self.send({"prune": prune})
