"""Sweeps and trials over REST: create, list, show, cancel, resume, trials, logs.

Routes naming a sweep are :class:`~tuner.api.access.SweepRoute`: by the time a method here
runs, the caller is known and the sweep is theirs (or they are a tuner admin)."""

from __future__ import annotations

import asyncio
import base64
import binascii
from typing import Any

from tunehub_base.outage import REQUEST_KEY
from tuner.api.access import SweepRoute
from tuner.api.auth import UserHandler
from tuner.api.base import ApiError, parse_id
from tuner.lifecycle.states import SweepState, TrialState
from tuner.metrics import SWEEPS_SUBMITTED
from tuner.sdk.run_function import COMMAND as FUNCTION_COMMAND
from tuner.sdk.run_function import FUNCTION_FILE
from tuner.serialize import sweep_view, trials_view
from tuner.spec import SpecError, SweepSpec

MAX_FUNCTION_BYTES = 20 * 1024 * 1024


class SweepsHandler(UserHandler):
    def get(self) -> None:
        self.send([sweep_view(s) for s in self.ctx.store.list(self.actor)])

    async def post(self) -> None:
        actor = self.actor
        body = self.json_body()
        unknown = set(body) - {"spec", "backend", "function"}
        if unknown:
            raise ApiError(400, f"unknown field {sorted(unknown)[0]!r}; expected spec, backend, "
                           "function", field=sorted(unknown)[0])
        raw = body.get("spec")
        if not isinstance(raw, dict):
            raise ApiError(400, "spec: expected an object with the sweep's fields", "spec")
        files: dict[str, bytes] = {}
        if body.get("function") is not None:
            files[FUNCTION_FILE] = _decode_function(body["function"])
            if raw.get("command") not in (None, FUNCTION_COMMAND):
                raise ApiError(400, "command: give either a command or a function", "command")
            raw = {**raw, "command": FUNCTION_COMMAND}
        spec = SweepSpec.from_dict(raw)
        backend_name = body.get("backend") or self.ctx.default_backend
        backend = self.ctx.backends.get(backend_name) if isinstance(backend_name, str) else None
        if backend is None:
            raise SpecError(
                "backend",
                f"expected one of {' | '.join(self.ctx.backends)}, got {backend_name!r}",
            )
        # Checking the code directory, copying its snapshot, a cluster's dry run and creating
        # the study can take seconds: in a thread, so other requests and trial reports are
        # answered meanwhile.
        key = _request_key(self.request.headers.get(REQUEST_KEY))
        sweep = await asyncio.to_thread(
            self.ctx.store.submit, spec, actor, backend, files, True, key
        )
        if sweep.state == SweepState.QUEUED:  # new, or sent again before anything ran it
            SWEEPS_SUBMITTED.labels(backend.name).inc()
            self.ctx.engine.run_sweep(sweep.id)
        self.send(sweep_view(self.ctx.store.get(sweep.id, actor)), status=201)


def _request_key(value: str | None) -> str | None:
    """The request's ``Idempotency-Key`` header (the client's one name for this submission,
    the same on every retry of it), checked."""
    if value is None:
        return None
    if not 1 <= len(value) <= 64 or not value.isascii() or not value.isprintable():
        raise ApiError(400, f"{REQUEST_KEY}: expected 1 to 64 printable ASCII characters",
                       REQUEST_KEY)
    return value


def _decode_function(value: Any) -> bytes:
    if not isinstance(value, str):
        raise ApiError(400, "function: expected base64 of a cloudpickled callable", "function")
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, "function: not valid base64", "function") from None
    if len(data) > MAX_FUNCTION_BYTES:
        raise ApiError(400, "function: larger than 20 MiB; put data in the data store",
                       "function")
    return data


class SweepHandler(SweepRoute):
    def get(self, _sweep_id: str) -> None:
        self.send(sweep_view(self.sweep))


class SweepCancelHandler(SweepRoute):
    def post(self, _sweep_id: str) -> None:
        self.send(sweep_view(self.ctx.store.cancel(self.sweep.id, self.actor, self.ctx.engine)))


class SweepResumeHandler(SweepRoute):
    def post(self, _sweep_id: str) -> None:
        sid = self.sweep.id
        self.ctx.engine.run_sweep(sid)
        self.send(sweep_view(self.ctx.store.get(sid, self.actor)))


class TrialsHandler(SweepRoute):
    async def get(self, _sweep_id: str) -> None:
        views = trials_view(self.ctx.store, self.sweep.id, self.actor)
        queue = self.ctx.gpu_queue
        if queue is not None and any(v["state"] == TrialState.PENDING for v in views):
            # A trial waiting for a GPU says its place in the pool's line, read now.
            places = await queue.places(self.sweep.id)
            for view in views:
                place = places.get(view["number"]) if view["state"] == TrialState.PENDING else None
                said = view.get("reason")
                if place is not None:  # (a preempted trial keeps why, its place after it)
                    view["reason"] = place if not said or said.startswith(
                        "waiting for a GPU") else f"{said}; {place}"
        self.send(views)


class TrialLogHandler(SweepRoute):
    async def get(self, _sweep_id: str, number: str) -> None:
        n = parse_id(number, f"sweep {self.sweep.id} has no trial {number[:40]}")
        data = await asyncio.to_thread(self.ctx.store.read_log, self.sweep.id, n, self.actor)
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(data)
