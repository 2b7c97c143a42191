"""The trial-side SDK: what user training code imports.

Inside a sweep the controller starts the trial with ``TUNEHUB_*`` variables: its parameters, the
URL to report to and a token valid for this trial only. Trial code never opens the database.
Outside a sweep every call degrades to something useful for debugging in a notebook: defaults
for parameters, no-op reporting, a local artifact directory.

Only the standard library is imported here so a trial starts fast.
"""

from __future__ import annotations

import atexit

# The report's connect encodes the API's host name with the idna codec, which imports three
# modules (unicodedata among them) on first use: imported here, a warm-started trial finds them
# in its zygote instead of loading them inside its report (5 ms of every trial's life).
import encodings.idna  # noqa: F401
import json
import os
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tunehub_base.outage import OUTAGE_SECONDS
from tunehub_base.tls import api_context

ENV_PARAMS = "TUNEHUB_PARAMS"
ENV_API_URL = "TUNEHUB_API_URL"
ENV_TRIAL_ID = "TUNEHUB_TRIAL_ID"
ENV_ATTEMPT = "TUNEHUB_TRIAL_ATTEMPT"
ENV_TOKEN = "TUNEHUB_TRIAL_TOKEN"
ENV_ARTIFACT_DIR = "TUNEHUB_ARTIFACT_DIR"
ENV_DATA = "TUNEHUB_DATA"
#: The trial's checkpoint directory, kept across its attempts (:mod:`tuner.sdk.checkpoints`).
ENV_CHECKPOINT_DIR = "TUNEHUB_CHECKPOINT_DIR"
#: Set in a network island: the Unix socket that reaches the tuner (``ENV_API_URL`` still names
#: the route).
ENV_API_SOCKET = "TUNEHUB_API_SOCKET"

#: How long a report keeps retrying before it gives up on that report: a tuner that does not
#: answer (restarting after a SIGKILL, a rolling update, its pod rescheduled) or answers 503
#: (its database is away) is waited out as long as the controllers wait out an outage
#: (OUTAGE_SECONDS), so a trial that keeps running through the tuner's restart (Kubernetes)
#: still lands its results once it is back.
REPORT_PATIENCE_SECONDS = OUTAGE_SECONDS


class Pruned(Exception):
    """Raised by :func:`report` when the sweep's pruner stops this trial early.

    Let it propagate (or catch it and exit): the trial is then recorded as pruned."""


def in_trial() -> bool:
    """True when running as a trial of a sweep."""
    return bool(os.environ.get(ENV_TRIAL_ID))


def is_chief() -> bool:
    """Whether this process is the worker that speaks for a multi-worker trial (``workers: N``):
    ``TF_CONFIG``'s ``chief`` task, or worker 0 when the cluster has no chief (how tunehub
    starts workers, locally and as an Indexed Job). Only the chief reports and saves the model;
    the others run the same script unchanged. True for ordinary single-process trials."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return True
    try:
        config = json.loads(raw)
        task = config.get("task") or {}
        kind, index = task.get("type"), int(task.get("index", 0))
    except (ValueError, TypeError, AttributeError):
        return True
    if "chief" in (config.get("cluster") or {}):
        return kind == "chief"
    return kind in (None, "worker") and index == 0


def params(defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """This trial's hyperparameters laid over ``defaults``; outside a sweep, the defaults."""
    merged = dict(defaults or {})
    raw = os.environ.get(ENV_PARAMS)
    if raw:
        merged.update(json.loads(raw))
    return merged


def data_dir() -> Path:
    """The shared data store: the same path in notebooks and trials."""
    root = os.environ.get(ENV_DATA)
    if root:
        return Path(root)
    from tunehub_base.settings import load_settings

    return load_settings().data


def artifact_dir() -> Path:
    """Where this trial writes what it wants kept (the saved model goes in ``model/``)."""
    path = Path(os.environ.get(ENV_ARTIFACT_DIR) or Path.cwd() / "tunehub-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


def report(value: float | dict[str, float], step: int | None = None, last: bool = False) -> None:
    """Report the sweep metric. With ``step`` it is an intermediate value (e.g. per epoch) the
    pruner judges; the last reported value is the trial's result. ``last=True`` says this is
    the trial's final step: it is never pruned there (it has trained to the end).

    A mapping (``report({"val_accuracy": 0.97, "params_k": 12})``, no ``step``) is the
    trial's final result with every metric it has: the sweep's metric is its result, a
    multi-objective sweep's ``metrics`` (all of them but the serving figures tunehub measures
    itself) are its values, and all are kept on the trial.

    Raises :class:`Pruned` when the pruner says stop. A no-op outside a sweep, and on the
    workers of a multi-worker trial other than the chief (:func:`is_chief`): the chief's values
    are the trial's (metrics of a distributed ``fit`` are already reduced across workers).
    """
    body: dict[str, Any] = {"step": step, "attempt": int(os.environ.get(ENV_ATTEMPT, "1"))}
    if isinstance(value, dict):
        if step is not None:
            raise ValueError("several metrics are the final result: report them without a step")
        body["metrics"] = {str(k): float(v) for k, v in value.items()}
    else:
        body["value"] = float(value)
    if not in_trial() or not is_chief():
        return
    if step is not None and not last and "value" in body and _held.hold(step, body["value"]):
        return
    _held.send()  # what is held goes first: the tuner takes a trial's values in order
    if _held.pruned_at is not None:
        raise Pruned(f"pruned at step {_held.pruned_at}")
    if last:
        body["last"] = True
    answer = _post(f"trials/{os.environ[ENV_TRIAL_ID]}/report", body)
    _held.seconds = float(answer.get("batch_seconds") or 0)
    if answer.get("prune"):
        raise Pruned(f"pruned at step {step}")


class _HeldReports:
    """Intermediate values held to be sent together (one request for many steps), where the
    tuner allows it: its answer's ``batch_seconds`` (``TUNEHUB_REPORT_BATCH_SECONDS`` for a
    sweep that never prunes, else 0). A value is held at most that long (a timer thread sends
    what is held then), and what is held is sent before any other report, a checkpoint
    (:func:`tuner.checkpoint`) and the process's exit; a trial killed outright loses what it
    held (at most ``batch_seconds`` of intermediate values, never its final result)."""

    def __init__(self) -> None:
        self.seconds = 0.0  # until the tuner's first answer: each value sent at once
        self.steps: list[dict[str, Any]] = []
        self.lock = threading.Lock()  # the values held (taken briefly: holding never waits)
        self.sending = threading.Lock()  # one request at a time, so they arrive in order
        self.timer: threading.Timer | None = None
        self.pruned_at: int | None = None
        self.registered = False

    def hold(self, step: int, value: float) -> bool:
        """Keep ``value`` to send with others; False when values are sent at once. Never
        waits for a request under way (the timer's send runs in its own thread)."""
        if self.pruned_at is not None:
            raise Pruned(f"pruned at step {self.pruned_at}")
        if self.seconds <= 0:
            return False
        with self.lock:
            self.steps.append({"step": int(step), "value": float(value)})
            if not self.registered:
                atexit.register(self.send)
                self.registered = True
            if self.timer is None:
                self.timer = threading.Timer(self.seconds, self.send)
                self.timer.daemon = True
                self.timer.start()
        return True

    def send(self) -> None:
        """Send what is held now (one request, its steps in order), after any request already
        under way."""
        with self.sending:
            with self.lock:
                if self.timer is not None:
                    self.timer.cancel()
                    self.timer = None
                steps, self.steps = self.steps, []
            if not steps:
                return
            answer = _post(f"trials/{os.environ[ENV_TRIAL_ID]}/report", {
                "steps": steps, "attempt": int(os.environ.get(ENV_ATTEMPT, "1"))})
            self.seconds = float(answer.get("batch_seconds") or 0)
            if answer.get("prune"):
                self.pruned_at = int(answer.get("step", steps[-1]["step"]))


_held = _HeldReports()


def send_held_reports() -> None:
    """Send the intermediate values this trial holds (before a checkpoint: a resumed attempt
    starts after the checkpoint's step, so nothing before it may be left unsent)."""
    _held.send()


def save_model(model: Any, name: str = "model") -> Path:
    """Export a Keras model as a TensorFlow SavedModel into the trial's artifact directory,
    the layout TensorFlow Serving loads; the sweep's best trial's export is registered.

    In a multi-worker trial every worker must call it (saving distributed variables can take
    part in collective ops); only the chief's export is kept, the others go to a temporary
    directory that is removed again."""
    if not is_chief():
        import shutil
        import tempfile

        scratch = Path(tempfile.mkdtemp(prefix="tunehub-worker-export-"))
        try:
            _export(model, scratch / name)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return scratch / name
    target = artifact_dir() / name
    if target.exists():
        import shutil

        shutil.rmtree(target)
    _export(model, target)
    return target


def _export(model: Any, target: Path) -> None:
    if hasattr(model, "export"):  # Keras 3: an inference SavedModel with a serving signature
        model.export(str(target), format="tf_saved_model", verbose=False)
    else:  # a plain tf.Module
        import tensorflow as tf

        tf.saved_model.save(model, str(target))


def _post(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST to the tuner API with the trial token, retrying while the controller is away, so a
    restarting controller does not lose results."""
    url = os.environ[ENV_API_URL].rstrip("/") + "/api/v1/" + path
    data = json.dumps(body).encode()
    headers = {
        "Content-Type": "application/json",
        "Authorization": f"Bearer {os.environ.get(ENV_TOKEN, '')}",
    }
    send = _sender(os.environ.get(ENV_API_SOCKET), api_context())
    deadline = time.monotonic() + REPORT_PATIENCE_SECONDS
    delay = 0.2
    since: float | None = None  # when the tuner stopped answering (said once, on stderr)
    while True:
        try:
            status, answer = send(url, data, headers)
            if status < 400:
                if since is not None:
                    print(f"tunehub: the tuner answers again; report sent after "
                          f"{time.time() - since:.0f} s", file=sys.stderr)
                return json.loads(answer or b"{}")
            if status < 500:
                detail = answer.decode(errors="replace")
                raise RuntimeError(f"tunehub refused the report ({status}): {detail}")
            error: Exception = RuntimeError(f"HTTP {status}")
        except (OSError, TimeoutError, _TransportError) as exc:
            error = exc
        if since is None:
            since = time.time()
            print(f"tunehub: the tuner is unreachable since "
                  f"{time.strftime('%H:%M:%S', time.localtime(since))} ({error}); retrying "
                  f"for up to {REPORT_PATIENCE_SECONDS:.0f} s", file=sys.stderr)
        if time.monotonic() > deadline:
            print(f"tunehub: could not report to {url}: {error}", file=sys.stderr)
            return {}
        time.sleep(delay)  # back-off between retries of a network call, not synchronisation
        delay = min(delay * 2, 5.0)


class _TransportError(Exception):
    """The connection to the tuner failed (either transport): the report is retried."""


_Sender = Callable[[str, bytes, dict[str, str]], tuple[int, bytes]]


def _sender(socket_path: str | None, context: ssl.SSLContext | None) -> _Sender:
    """How a report travels: over TCP to the URL, or, in a network island (one machine, where
    the trial's network is its own: :mod:`tuner.backends.local.island`), over the Unix socket
    ``TUNEHUB_API_SOCKET`` the tuner listens on for this attempt (the URL still names the
    route and the ``Host``). httpx is imported only then: a trial elsewhere starts without it.
    ``context``: how the tuner is verified (:func:`tunehub_base.tls.api_context`), either way:
    the socket only carries the bytes, TLS stays end to end."""
    if socket_path:
        import httpx

        def over_socket(url: str, data: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
            try:
                transport = httpx.HTTPTransport(uds=socket_path, verify=context or True)
                with httpx.Client(transport=transport,
                                  timeout=30) as client:
                    response = client.post(url, content=data, headers=headers)
            except httpx.TransportError as exc:
                raise _TransportError(str(exc)) from None
            return response.status_code, response.content

        return over_socket

    def over_tcp(url: str, data: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        request = urllib.request.Request(url, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=30, context=context) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except urllib.error.URLError as exc:
            raise _TransportError(str(exc.reason)) from None

    return over_tcp
