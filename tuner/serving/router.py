"""``tunehub model serve NAME --upstream URL``: the same server in front of TensorFlow Serving.

On Kubernetes the models run in TensorFlow Serving (the chart's ``serving``), whose ``stable``
and ``canary`` labels follow the registry through ``models.config``
(:mod:`tuner.serving.models_config`). TensorFlow Serving splits no traffic and judges nothing,
so this mode of ``model serve`` runs in front of it: the same routes, bounds, per-client limit
and gradual release as the local mode (:class:`~tuner.serving.server.ModelServer`'s ``route``
and :class:`~tuner.serving.canary.CanaryRelease`, one implementation of the rules), but each
request is answered by forwarding it:

- ``/v1/models/NAME:predict`` (the production route): the canary's share (by the same counter)
  goes to ``/v1/models/NAME/versions/V:predict``, V being the registry's canary; the rest to
  ``/labels/stable:predict``. The canary is asked by its number, not its label, so what is
  judged is exactly the version the registry names (TensorFlow Serving moves a label only at its
  next config poll, and only to a version that has loaded). Production is asked by its label, so
  TensorFlow Serving keeps answering from the old version while a new one loads.
- ``/versions/N:predict``, ``/labels/stable|canary|production:predict`` and the status routes
  (``GET /v1/models/NAME[/versions/N|/labels/L]``) are forwarded as asked (``production`` is
  ``stable`` there): not part of the release.

**Judging the canary's answers.** A 2xx is a clean answer, timed around the forwarded call
(the same span for every version). Anything else is answered by production instead (the client
never sees the canary's failure), and counts as a canary error only when production answered
the same request: TensorFlow Serving answers a failing model's invalid argument (a failed
assertion) with the same 400 as a malformed request, so the difference is whether production
could answer it. Not judged at all: a 404 (TensorFlow Serving has not loaded the version yet,
its config is polled) and a 429 (upstream busy). A canary that gives no answer within the
timeout, or a 5xx, is an error as long as production answers. Moves are made in the registry as
in the local mode, with the reasons in the history; the registry rewrites ``models.config`` and
TensorFlow Serving's labels follow at its next poll.

When the registry cannot be read (database away), the production route still goes to
``/labels/stable``: TensorFlow Serving needs no database to answer.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx

from tuner.errors import NotFound
from tuner.serving.canary import first_line
from tuner.serving.server import BadRequest, ModelServer, PredictHandler, _Handler

log = logging.getLogger("tunehub.serve.router")

#: This server's labels and the upstream's (TensorFlow Serving knows ``stable`` and ``canary``,
#: the labels the registry writes; ``production`` is this server's name for ``stable``).
UPSTREAM_LABELS = {"stable": "stable", "canary": "canary", "production": "stable"}
#: Answers that say nothing about the canary model: not loaded (yet), upstream busy.
NOT_JUDGED = (404, 429)


@dataclass(frozen=True)
class Reply:
    """What TensorFlow Serving answered (or a 502 saying it did not), and how long it took."""

    status: int
    body: bytes
    seconds: float
    answered: bool = True

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def said(self) -> str:
        """One line for the history: the status and what the answer says failed."""
        text = self.body.decode("utf-8", "replace")
        try:
            error = json.loads(text).get("error", text)
        except (ValueError, AttributeError):
            error = text
        prefix = f"HTTP {self.status}" if self.answered else "no answer"
        return f"{prefix}: {first_line(str(error))}"


class Upstream:
    """TensorFlow Serving's REST API for one model, at a base URL (``http://host:8501``)."""

    def __init__(self, url: str, model: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.base = f"{self.url}/v1/models/{model}"
        self.timeout = timeout
        # Kept-alive connections (no new TCP handshake per request); no proxy from the
        # environment: the upstream is the cluster's own Service.
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
            trust_env=False, follow_redirects=False)

    async def call(self, method: str, suffix: str, content: bytes | None = None) -> Reply:
        """``method`` on ``/v1/models/NAME<suffix>``; no answer is a 502 saying why."""
        started = time.perf_counter()
        headers = {"Content-Type": "application/json"} if content is not None else None
        try:
            r = await self.client.request(method, f"{self.base}{suffix}", content=content,
                                          headers=headers)
        except httpx.HTTPError as exc:
            said = f"TensorFlow Serving at {self.url} gave no answer: {type(exc).__name__}"
            if str(exc):
                said += f": {exc}"
            if isinstance(exc, httpx.TimeoutException):
                said += f" (in {self.timeout:g} s)"
            return Reply(502, json.dumps({"error": said}).encode(),
                         time.perf_counter() - started, answered=False)
        return Reply(r.status_code, r.content, time.perf_counter() - started)

    async def close(self) -> None:
        await self.client.aclose()


class ForwardHandler(PredictHandler):
    """The predict routes, answered by the upstream (the request parsed and bounded here
    first, so a malformed one is refused as in the local mode, and forwarded as sent)."""

    def initialize(self, server: ModelServer, upstream: Upstream) -> None:  # type: ignore[override]
        super().initialize(server)
        self.upstream = upstream

    async def answer(self, body: dict[str, Any], version: str | None,
                     label: str | None) -> tuple[str, int, str | bytes]:
        raw = self.request.body or b""
        if version is not None:
            reply = await self.upstream.call("POST", f"/versions/{int(version)}:predict", raw)
            return version, reply.status, reply.body
        if label is not None:
            if label not in UPSTREAM_LABELS:
                raise BadRequest(f"unknown label {label!r}; use stable or canary")
            reply = await self.upstream.call(
                "POST", f"/labels/{UPSTREAM_LABELS[label]}:predict", raw)
            return label, reply.status, reply.body
        return await self.release(raw)

    async def release(self, raw: bytes) -> tuple[str, int, str | bytes]:
        """The production route: the canary's share to the canary, judged; the rest (and
        whatever the canary did not answer) to ``stable``."""
        server = self.server
        try:
            number, canary = server.route()
        except NotFound:
            raise  # no production version in the registry: 404, as in the local mode
        except Exception as exc:  # the registry away: TensorFlow Serving answers without it
            log.warning("the registry could not be read (%s): the production route goes to "
                        "the stable label, no canary is judged", exc)
            number, canary = 0, False
        tried = None
        if canary:
            tried = await self.upstream.call("POST", f"/versions/{number}:predict", raw)
            if tried.ok:
                server.canary_answered(number, tried.seconds)
                return str(number), tried.status, tried.body
        stable = await self.upstream.call("POST", "/labels/stable:predict", raw)
        if tried is not None:
            if tried.status in NOT_JUDGED:
                log.info("canary v%s not judged on a request (%s): answered by stable",
                         number, tried.said())
            elif stable.ok:  # production answered what the canary failed: the canary's error
                server.canary_failed(number, tried.said())
        return "stable", stable.status, stable.body


class StatusForwardHandler(_Handler):
    """``GET /v1/models/NAME[/versions/N|/labels/L]``: TensorFlow Serving's own status (what it
    has loaded), forwarded."""

    def initialize(self, server: ModelServer, upstream: Upstream) -> None:  # type: ignore[override]
        super().initialize(server)
        self.upstream = upstream

    async def get(self, name: str, version: str | None = None,
                  label: str | None = None) -> None:
        if not self.check_model(name):
            return
        suffix = ""
        if version is not None:
            suffix = f"/versions/{int(version)}"
        elif label is not None:
            if label not in UPSTREAM_LABELS:
                self.fail(400, f"unknown label {label!r}; use stable or canary")
                return
            suffix = f"/labels/{UPSTREAM_LABELS[label]}"
        reply = await self.upstream.call("GET", suffix)
        self.set_status(reply.status)
        self.finish(reply.body)
