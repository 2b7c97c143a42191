"""``tunehub model serve NAME``: TensorFlow Serving's REST API for the registry's versions.

Clients written for TensorFlow Serving work unchanged: ``POST /v1/models/NAME:predict`` (the
production version), ``/versions/N:predict``, ``/labels/stable|canary:predict``, row
(``instances``) and columnar (``inputs``) requests, ``GET /v1/models/NAME[/versions/N|/labels/L]``
for status. The labels mean what they mean in the TensorFlow Serving config the registry writes
(:mod:`tuner.serving.models_config`): ``stable`` is the production version, ``canary`` the canary. A
promotion is picked up without a restart (the stage is re-read at most every two seconds).

Every request is bounded like the tuner service's (:mod:`tunehub_base.request_bounds`: body size
413, JSON values and depth 400, each naming the limit), and one client address has at most
``TUNEHUB_SERVE_MAX_CLIENT_REQUESTS`` predictions in flight (more: 429 naming it), so one client
cannot hold every worker thread while others wait. The address is the connection's own (no
forwarded headers are believed here).

With ``--upstream URL`` the same server runs in front of TensorFlow Serving (on Kubernetes, the
chart's): the same routes, bounds and canary release, each request answered by forwarding it
(:mod:`tuner.serving.router`). A model that fails on a request is answered as TensorFlow
Serving answers it: 400 for an invalid argument (a failed assertion in its graph), else 500,
with the line that says what failed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter as Tally
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import tornado.ioloop
import tornado.web
from prometheus_client import Counter, Histogram

from tunehub_base.options import setting
from tunehub_base.request_bounds import BodyError, BoundedApplication, RequestLimits, parse_json
from tuner.errors import NotFound
from tuner.metrics import MetricsHandler
from tuner.serving.canary import CanaryMove, CanaryPolicy, CanaryRelease, describe_error
from tuner.serving.models_config import LABELS as SERVING_LABELS
from tuner.serving.registry import STAGES, Registry

if TYPE_CHECKING:
    from tuner.serving.router import Upstream

log = logging.getLogger("tunehub.serve")
STAGE_TTL = 2.0
LABELS = {**SERVING_LABELS, "production": "production"}

PREDICTIONS = Counter(
    "tunehub_serving_requests_total", "Predict requests", ["model", "version", "code"]
)
LATENCY = Histogram("tunehub_serving_latency_seconds", "Predict latency", ["model"])


class BadRequest(Exception):
    """A predict request TensorFlow Serving would answer with 400."""


class ModelServer:
    """Loaded versions of one model and the stage lookup."""

    def __init__(self, registry: Registry, model: str, max_client_requests: int = 8,
                 canary: CanaryPolicy | None = None) -> None:
        self.registry = registry
        self.model = model
        #: The gradual release of a canary version (:mod:`tuner.serving.canary`), if asked.
        self.canary = CanaryRelease(canary) if canary is not None else None
        self.max_client_requests = max_client_requests
        self.in_flight: Tally[str] = Tally()  # predictions running, by client address
        self._loaded: dict[int, Any] = {}
        #: Where predictions run: not the event loop's default executor, whose running work
        #: ``asyncio.run`` waits for at Ctrl-C (a model still loading on a busy machine held
        #: the stop for over a minute); :func:`serve` drops what has not started.
        self.predictions = ThreadPoolExecutor(thread_name_prefix="tunehub-predict")
        self._stages: dict[str, tuple[float, int | None]] = {}

    def version_for(self, stage: str) -> int:
        cached = self._stages.get(stage)
        if cached is None or time.monotonic() - cached[0] > STAGE_TTL:
            row = self.registry.at_stage(self.model, stage)
            cached = (time.monotonic(), row.version if row else None)
            self._stages[stage] = cached
        if cached[1] is None:
            raise NotFound(f"model {self.model} has no {stage} version")
        return cached[1]

    def route(self) -> tuple[int, bool]:
        """The production route's version for the next request: (version, is it the
        canary's)."""
        if self.canary is not None and self.canary.goes_to_canary():
            try:
                version = self.version_for("canary")
            except NotFound:
                pass  # no canary now: production takes it
            else:
                self.canary.routed(version)  # its time starts at its first request
                return version, True
        return self.version_for("production"), False

    def canary_answered(self, version: int, seconds: float) -> None:
        if self.canary is not None:
            self._move(version, self.canary.answered(version, seconds))

    def canary_failed(self, version: int, error: str) -> None:
        if self.canary is not None:
            self._move(version, self.canary.failed(version, error))

    def canary_due(self) -> None:
        """Between requests: a canary whose time has come (``--canary-seconds``) moves even
        when no request arrives to judge it. (Called on the event loop, as every other
        counting call: the version read here is the one ``due`` judges.)"""
        if self.canary is not None and self.canary.version is not None:
            self._move(self.canary.version, self.canary.due())

    def _move(self, version: int, move: CanaryMove | None) -> None:
        """Carry out what the canary's counters decided, with its reason in the history; not
        when the version is no longer the canary (moved by hand meanwhile). A move the
        registry cannot make now (its database away) is judged again later."""
        if move is None or self.canary is None:
            return
        try:
            current = self.registry.at_stage(self.model, "canary")
            if current is None or current.version != version:
                log.info("canary v%s: no longer the canary, not moved (%s)", version,
                         move.reason)
            elif move.forward:
                self.registry.promote(self.model, version, "production", is_admin=True,
                                      reason=f"{move.reason}: rolled forward")
                log.info("%s", move.reason)
            else:
                self.registry.retire(self.model, version, move.reason)
                log.warning("%s", move.reason)
        except Exception as exc:  # e.g. the database away: served on, moved later
            log.warning("canary v%s: could not move it (%s): %s; judged again later", version,
                        move.reason, exc)
            self.canary.reopen(version)
            return
        finally:
            self._stages.clear()
        self.canary.forget(version)

    def load(self, version: int) -> Any:
        if version not in self._loaded:
            import tensorflow as tf

            row = self.registry.get(self.model, version)
            self._loaded[version] = tf.saved_model.load(row.path)
        return self._loaded[version]

    def predict(self, version: int, body: dict[str, Any]) -> dict[str, Any]:
        import numpy as np
        import tensorflow as tf

        loaded = self.load(version)
        name = body.get("signature_name", "serving_default")
        if name not in loaded.signatures:
            raise BadRequest(f"signature_name {name!r} not found; the model has "
                             f"{', '.join(sorted(loaded.signatures))}")
        fn = loaded.signatures[name]
        specs = fn.structured_input_signature[1]
        rows = "instances" in body
        data = body.get("instances", body.get("inputs"))
        if data is None:
            raise BadRequest("the request needs 'instances' (row format) or 'inputs' "
                             "(columnar format)")
        if isinstance(data, dict):
            feeds = data
        elif rows and data and isinstance(data[0], dict):
            feeds = {k: [row[k] for row in data] for k in data[0]}
        elif len(specs) == 1:
            feeds = {next(iter(specs)): data}
        else:
            raise BadRequest(f"this signature takes named inputs: {', '.join(sorted(specs))}")
        tensors = {}
        for key, spec in specs.items():
            if key not in feeds:
                raise BadRequest(f"missing input {key!r}")
            try:
                value = np.asarray(feeds[key], dtype=spec.dtype.as_numpy_dtype)
            except (TypeError, ValueError):
                raise BadRequest(f"input {key!r} is not a {spec.dtype.name} array") from None
            if not spec.shape.is_compatible_with(value.shape):
                raise BadRequest(
                    f"input {key!r} has shape {list(value.shape)}, the model expects "
                    f"{spec.shape.as_list()} (None = any)"
                )
            tensors[key] = tf.constant(value)
        outputs = {k: v.numpy().tolist() for k, v in fn(**tensors).items()}
        single = next(iter(outputs.values())) if len(outputs) == 1 else None
        if rows:
            return {"predictions": single if single is not None else [
                {k: outputs[k][i] for k in outputs} for i in range(len(data))]}
        return {"outputs": single if single is not None else outputs}


class _Handler(tornado.web.RequestHandler):
    def initialize(self, server: ModelServer) -> None:
        self.server = server

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json")

    def fail(self, status: int, message: str) -> None:
        self.set_status(status)
        self.finish(json.dumps({"error": message}))

    def check_model(self, name: str) -> bool:
        if name != self.server.model:
            self.fail(404, f"Servable not found for request: Latest({name})")
            return False
        return True


class PredictHandler(_Handler):
    async def post(self, name: str, version: str | None, label: str | None) -> None:
        if not self.check_model(name):
            return
        client = self.request.remote_ip or ""
        if self.server.in_flight[client] >= self.server.max_client_requests:
            self.fail(429, f"more than {self.server.max_client_requests} predictions at once "
                      "from one client (TUNEHUB_SERVE_MAX_CLIENT_REQUESTS); wait for an answer")
            PREDICTIONS.labels(name, version or label or "production", "429").inc()
            return
        self.server.in_flight[client] += 1
        try:
            await self._predict(name, version, label)
        finally:
            self.server.in_flight[client] -= 1
            if not self.server.in_flight[client]:
                del self.server.in_flight[client]

    async def _predict(self, name: str, version: str | None, label: str | None) -> None:
        started = time.perf_counter()
        limits: RequestLimits = self.settings["request_limits"]
        asked = version or label or "production"
        try:
            body = parse_json(self.request.body or b"", limits)
            if not isinstance(body, dict):
                raise BadRequest("the request body must be a JSON object")
            served, status, payload = await self.answer(body, version, label)
        except BodyError as exc:  # not JSON, or over a bound: the reason names it
            self.fail(exc.status, str(exc))
            PREDICTIONS.labels(name, asked, "400").inc()
            return
        except BadRequest as exc:
            self.fail(400, str(exc))
            PREDICTIONS.labels(name, asked, "400").inc()
            return
        except NotFound as exc:
            self.fail(404, str(exc))
            PREDICTIONS.labels(name, asked, "404").inc()
            return
        PREDICTIONS.labels(name, served, str(status)).inc()
        if status == 200:
            LATENCY.labels(name).observe(time.perf_counter() - started)
        self.set_status(status)
        self.finish(payload)

    async def answer(self, body: dict[str, Any], version: str | None,
                     label: str | None) -> tuple[str, int, str | bytes]:
        """Answer a well-formed request: (the version that answered, status, JSON body). Here
        the model runs in this process; the router mode forwards instead
        (:mod:`tuner.serving.router`)."""
        canary = False
        if version is not None:
            number = int(version)
            self.server.registry.get(self.server.model, number)
        elif label is not None:
            if label not in LABELS:
                raise BadRequest(f"unknown label {label!r}; use stable or canary")
            number = self.server.version_for(LABELS[label])
        else:
            number, canary = self.server.route()
        loop = asyncio.get_running_loop()
        asked = time.perf_counter()
        try:
            result = await loop.run_in_executor(self.server.predictions, self.server.predict,
                                                number, body)
        except (BadRequest, BodyError, NotFound):
            raise
        except Exception as exc:
            if not canary:
                return str(number), *model_failure(exc)
            # The canary failed where production may not: say so, answer from production.
            self.server.canary_failed(number, describe_error(exc))
            number = self.server.version_for("production")
            try:
                result = await loop.run_in_executor(self.server.predictions,
                                                    self.server.predict, number, body)
            except (BadRequest, BodyError, NotFound):
                raise
            except Exception as again:
                return str(number), *model_failure(again)
        else:
            if canary:
                self.server.canary_answered(number, time.perf_counter() - asked)
        return str(number), 200, json.dumps(result)


def model_failure(exc: BaseException) -> tuple[int, str]:
    """A model that failed on a request, answered as TensorFlow Serving answers it: 400 for an
    invalid argument (a failed assertion or check in the graph), 500 for anything else, with
    the one line that says what failed."""
    import tensorflow as tf  # loaded already: the model that failed ran on it

    status = 400 if isinstance(exc, tf.errors.InvalidArgumentError) else 500
    log.warning("the model failed on a request (%d): %s", status, describe_error(exc))
    return status, json.dumps({"error": describe_error(exc)})


class StatusHandler(_Handler):
    def get(self, name: str, version: str | None = None, label: str | None = None) -> None:
        if not self.check_model(name):
            return
        try:
            rows = self.server.registry.versions(name)
            if label is not None:
                if label not in LABELS:
                    self.fail(400, f"unknown label {label!r}; use stable or canary")
                    return
                version = str(self.server.version_for(LABELS[label]))
        except NotFound as exc:
            self.fail(404, str(exc))
            return
        if version is not None:
            rows = [r for r in rows if r.version == int(version)]
            if not rows:
                self.fail(404, f"model {name} has no version {version}")
                return
        status = [
            {
                "version": str(r.version),
                "state": "AVAILABLE" if r.stage in STAGES else "END",
                "status": {"error_code": "OK", "error_message": ""},
                "stage": r.stage,
            }
            for r in rows
        ]
        self.finish(json.dumps({"model_version_status": status}))


def make_app(registry: Registry, model: str, limits: RequestLimits | None = None,
             server: ModelServer | None = None,
             canary: CanaryPolicy | None = None,
             upstream: Upstream | None = None) -> tornado.web.Application:
    """The serving routes; ``server``: the versions they serve (the registry's by default;
    the serving-cost measurement passes one model directory, :mod:`tuner.serving.cost`);
    ``canary``: release the canary version gradually (:mod:`tuner.serving.canary`);
    ``upstream``: answer by forwarding to that TensorFlow Serving instead of running the models
    here (:mod:`tuner.serving.router`), the release judged and moved the same way."""
    server = server or ModelServer(registry, model,
                                   setting("TUNEHUB_SERVE_MAX_CLIENT_REQUESTS").number(),
                                   canary=canary)
    predict: type[tornado.web.RequestHandler] = PredictHandler
    status: type[tornado.web.RequestHandler] = StatusHandler
    kw: dict[str, Any] = {"server": server}
    if upstream is not None:
        from tuner.serving.router import ForwardHandler, StatusForwardHandler

        predict, status = ForwardHandler, StatusForwardHandler
        kw["upstream"] = upstream
    name = r"([a-z0-9-]+)"
    # Bounded before any route sees a request, as every tunehub server (request_bounds).
    return BoundedApplication(
        [
            (rf"/v1/models/{name}(?:/versions/(\d+))?(?:/labels/([a-z]+))?:predict",
             predict, kw),
            (rf"/v1/models/{name}(?:/versions/(\d+))?(?:/labels/([a-z]+))?", status, kw),
            (r"/metrics", MetricsHandler),
        ],
        request_limits=limits or RequestLimits.from_env(),
    )


async def serve(registry: Registry, model: str, host: str, port: int,
                canary: CanaryPolicy | None = None, upstream: str | None = None,
                upstream_timeout: float = 30.0) -> None:
    """Serve until cancelled; with ``upstream`` (a TensorFlow Serving REST base URL), as the
    router in front of it."""
    registry.versions(model)  # an unknown model is an error now, not at the first request
    models = ModelServer(registry, model, setting("TUNEHUB_SERVE_MAX_CLIENT_REQUESTS").number(),
                         canary=canary)
    forward = None
    if upstream is not None:
        from tuner.serving.router import Upstream

        forward = Upstream(upstream, model, upstream_timeout)
    app = make_app(registry, model, server=models, upstream=forward)
    server = app.listen(port, host)
    clock = None
    if canary is not None and canary.promote_after_seconds is not None:
        # The canary's time is judged by the clock too, not only when an answer comes.
        every_ms = min(1000.0, max(50.0, canary.promote_after_seconds * 250))
        clock = tornado.ioloop.PeriodicCallback(models.canary_due, every_ms)
        clock.start()
    try:
        await asyncio.Event().wait()
    finally:
        if clock is not None:
            clock.stop()
        server.stop()
        models.predictions.shutdown(wait=False, cancel_futures=True)
        if forward is not None:
            await forward.close()
