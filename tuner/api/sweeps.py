"""Sweeps and trials over REST: create, list, show, cancel, resume, trials, logs."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from tuner.api.auth import READ, SUBMIT, UserHandler
from tuner.api.base import ApiError
from tuner.metrics import SWEEPS_SUBMITTED
from tuner.serialize import sweep_view, trial_view
from tuner.spec import SpecError, SweepSpec

FUNCTION_FILE = "objective.pkl"
FUNCTION_COMMAND = f"python -m tuner.run_function {FUNCTION_FILE}"
MAX_FUNCTION_BYTES = 20 * 1024 * 1024


class SweepsHandler(UserHandler):
    def get(self) -> None:
        actor = self.actor(READ)
        self.send([sweep_view(s) for s in self.ctx.store.list(actor)])

    def post(self) -> None:
        actor = self.actor(SUBMIT)
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
        backend = self.ctx.backends.get(backend_name)
        if backend is None:
            raise SpecError(
                "backend",
                f"expected one of {' | '.join(self.ctx.backends)}, got {backend_name!r}",
            )
        sweep = self.ctx.store.submit(spec, actor, backend, files=files)
        SWEEPS_SUBMITTED.labels(backend.name).inc()
        self.ctx.engine.run_sweep(sweep.id)
        self.send(sweep_view(self.ctx.store.get(sweep.id, actor)), status=201)


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


class SweepHandler(UserHandler):
    def get(self, sweep_id: str) -> None:
        self.send(sweep_view(self.ctx.store.get(int(sweep_id), self.actor(READ))))


class SweepCancelHandler(UserHandler):
    def post(self, sweep_id: str) -> None:
        actor = self.actor(SUBMIT)
        sid = int(sweep_id)
        if not self.ctx.engine.cancel(sid):
            self.ctx.store.request_cancel(sid, actor)
        else:
            self.ctx.store.get(sid, actor)  # ownership check before answering
        self.send(sweep_view(self.ctx.store.get(sid, actor)))


class SweepResumeHandler(UserHandler):
    def post(self, sweep_id: str) -> None:
        actor = self.actor(SUBMIT)
        sid = int(sweep_id)
        self.ctx.store.get(sid, actor)
        self.ctx.engine.run_sweep(sid)
        self.send(sweep_view(self.ctx.store.get(sid, actor)))


class TrialsHandler(UserHandler):
    def get(self, sweep_id: str) -> None:
        actor = self.actor(READ)
        sid = int(sweep_id)
        reports = self.ctx.store.reports(sid, actor)
        trials = self.ctx.store.trials(sid, actor)
        self.send([trial_view(t, reports.get(t.number, [])) for t in trials])


class TrialLogHandler(UserHandler):
    def get(self, sweep_id: str, number: str) -> None:
        path = self.ctx.store.log_path(int(sweep_id), int(number), self.actor(READ))
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(path.read_bytes())
