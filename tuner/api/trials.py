"""The trial report endpoint: per-trial tokens only, answers the pruning decision.

A token is valid only for the attempt it was made for, while that attempt runs: the controller
keeps its hash (never the token) and forgets it when the attempt ends, so a token of a finished
attempt, or of another trial, reports nothing. Every such refusal is one answer
(:func:`refused`): a trial that is not running, someone else's, an attempt that ended and a
number that names nothing all read the same, so the route never tells which trials run."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

from tunehub_base.gpu_usage import GpuReading
from tuner.api.base import MAX_ID, ApiError, JsonHandler, parse_id
from tuner.api.report_routing import FORWARDED, Route, forward, route_report
from tuner.errors import NotFound, Unauthorized, Unavailable
from tuner.scheduling.host import SweepHost
from tuner.scheduling.objectives import BadReport

#: At most this many metrics in one report, each name at most this long.
MAX_METRICS, MAX_METRIC_NAME = 32, 128
#: At most this many intermediate values in one report.
MAX_STEPS = 1000


def refused() -> ApiError:
    """The one answer to a report no running attempt takes (see the module's docstring); it
    does not even echo the trial's number, so its body is the same whichever trial was named."""
    return ApiError(401, "no running attempt of this trial takes this token")


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)  # a huge int overflows
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _small_int(value: Any, minimum: int) -> bool:
    return (not isinstance(value, bool) and isinstance(value, int)
            and minimum <= value <= MAX_ID)


def _metrics(raw: Any) -> dict[str, float] | None:
    """A final report's ``metrics`` ({name: finite number}), or None when absent."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or not raw or len(raw) > MAX_METRICS:
        raise ApiError(400, f"metrics: expected an object of 1 to {MAX_METRICS} metric names and "
                            "numbers", "metrics")
    out: dict[str, float] = {}
    for name, value in raw.items():
        number = _finite(value)
        if not name or len(name) > MAX_METRIC_NAME or number is None:
            raise ApiError(400, f"metrics.{name:.{MAX_METRIC_NAME}}: expected a name of at most "
                                f"{MAX_METRIC_NAME} characters and a finite number, got "
                                f"{value!r:.80}", f"metrics.{name:.{MAX_METRIC_NAME}}")
        out[name] = number
    return out


class TrialTokenHandler(JsonHandler):
    """What a running trial's calls share: its token (``Bearer``) and its attempt number."""

    def initialize(self, engine: SweepHost) -> None:
        self.engine = engine

    def token(self) -> str:
        auth = self.request.headers.get("Authorization", "")
        if not auth.startswith("Bearer ") or not auth[7:].strip():
            raise ApiError(401, "a trial token is required (Authorization: Bearer ...)")
        return auth[7:].strip()

    @staticmethod
    def attempt(body: dict[str, Any]) -> int:
        attempt = body.get("attempt", 1)
        if not _small_int(attempt, 1):
            raise ApiError(400, f"attempt: expected a positive integer, got {attempt!r:.80}",
                           "attempt")
        return int(attempt)


def _steps(raw: Any) -> list[tuple[int, float]]:
    """A batch's ``steps`` ([{"step": n, "value": x}, ...], in the order they were made)."""
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_STEPS:
        raise ApiError(400, f"steps: expected a list of 1 to {MAX_STEPS} objects with step and "
                            "value", "steps")
    out = []
    for n, item in enumerate(raw):
        step = item.get("step") if isinstance(item, dict) else None
        value = _finite(item.get("value")) if isinstance(item, dict) else None
        if not _small_int(step, 0) or value is None:
            raise ApiError(400, f"steps[{n}]: expected a step from 0 to {MAX_ID} and a finite "
                                f"value, got {item!r:.80}", f"steps[{n}]")
        out.append((int(step), value))  # type: ignore[arg-type]
    return out


def _last(body: dict[str, Any]) -> bool:
    """Whether the report's (last) step is the trial's final one: never pruned there."""
    last = body.get("last", False)
    if not isinstance(last, bool):
        raise ApiError(400, f"last: expected true or false, got {last!r:.80}", "last")
    return last


#: Judges a report for the trial numbered by its argument: the step it is pruned at, or None.
Judge = Callable[[int], Awaitable["int | None"]]


class ReportHandler(TrialTokenHandler):
    """One value (``value``, with ``step`` for an intermediate one), a final report of several
    metrics (``metrics``), or several intermediate values at once (``steps``). The answer:
    ``prune`` (and, for a batch, the ``step`` it came at) and ``batch_seconds``, how long the
    trial's SDK may hold intermediate values to send them together (0: answer each)."""

    async def post(self, trial_id: str) -> None:
        token = self.token()
        body = self.json_body()
        if "steps" in body:
            await self._judged(trial_id, token, self._batch(body, token), True)
            return
        metrics = _metrics(body.get("metrics"))
        value = _finite(body.get("value"))
        if metrics is not None and value is None:
            value = 0.0  # the primary metric is taken from ``metrics`` by the controller
        if value is None:
            raise ApiError(
                400, f"value: expected a finite number, got {body.get('value')!r:.80}", "value"
            )
        step = body.get("step")
        if step is not None and not _small_int(step, 0):
            raise ApiError(400, f"step: expected an integer from 0 to {MAX_ID}, got {step!r:.80}",
                           "step")
        attempt, last = self.attempt(body), _last(body)

        async def judge(tid: int) -> int | None:
            pruned = await self.engine.report_async(tid, token, attempt, value, step, last=last,
                                                    metrics=metrics)
            return step if pruned else None

        await self._judged(trial_id, token, judge, False)

    def _batch(self, body: dict[str, Any], token: str) -> Judge:
        """A batch's judge: its values, checked, for the controller."""
        for alone in ("value", "step", "metrics"):
            if alone in body:
                raise ApiError(400, f"{alone}: not with steps (a batch holds intermediate "
                                    "values only)", alone)
        steps = _steps(body["steps"])
        attempt, last = self.attempt(body), _last(body)

        async def judge(tid: int) -> int | None:
            return await self.engine.report_steps_async(tid, token, attempt, steps, last)

        return judge

    async def _judged(self, trial_id: str, token: str, judge: Judge, batch: bool) -> None:
        """The report judged by its trial's controller (``judge``: the step the trial is
        pruned at, or None) and answered; refused alike for any attempt not running, sent on
        to the replica that runs the trial where it runs elsewhere."""
        try:
            tid = parse_id(trial_id, "")
        except NotFound:
            raise refused() from None
        try:
            pruned_at = await judge(tid)
        except Unauthorized:
            raise refused() from None
        except NotFound:  # not running here: perhaps on another replica
            await self._elsewhere(tid, token)
            return
        except BadReport as exc:
            raise ApiError(400, str(exc), exc.field) from None
        answer: dict[str, Any] = {"prune": pruned_at is not None,
                                  "batch_seconds": self.engine.batch_seconds(tid)}
        if batch and pruned_at is not None:
            answer["step"] = pruned_at
        self.send(answer)

    async def _elsewhere(self, trial_id: int, token: str) -> None:
        """A report of a trial this tuner does not run (:mod:`tuner.api.report_routing`)."""
        if self.request.headers.get(FORWARDED):
            raise refused()  # sent on once already: never again
        routing = await route_report(self.engine.db, self.engine.replica_url, trial_id, token)
        if routing.route == Route.REFUSED:
            raise refused()
        if routing.route == Route.MOVING:
            raise Unavailable("this trial's sweep is moving to another tuner; retry shortly")
        status, body = await forward(str(routing.url), trial_id, self.request.body,
                                     self.request.headers.get("Authorization", ""))
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(body)


MAX_READINGS = 16  # GPUs one pod's reading may carry


class GpuUseHandler(TrialTokenHandler):
    """A Kubernetes trial pod's reading of its own GPUs (:mod:`tuner.sdk.gpu_report`), with
    the trial's token: the same rules as a report (refused alike for any attempt not running)."""

    def post(self, trial_id: str) -> None:
        token = self.token()
        body = self.json_body()
        attempt = self.attempt(body)
        raw = body.get("readings")
        if not isinstance(raw, list) or not 0 < len(raw) <= MAX_READINGS:
            raise ApiError(400, f"readings: expected a list of 1 to {MAX_READINGS} readings",
                           "readings")
        try:
            readings = [GpuReading.from_json(r) for r in raw]
        except ValueError as exc:
            raise ApiError(400, f"readings: {exc}", "readings") from None
        try:
            tid = parse_id(trial_id, "")
            answer = self.engine.gpu_use(tid, token, attempt, readings)
        except (NotFound, Unauthorized):
            raise refused() from None
        self.send(answer)
