"""What serving a trial's model costs, measured by the platform (not reported by the trial).

For each trial that saved a model, in a sweep that uses these figures (as objectives in
``metrics`` or as a budget in ``promote.constraints``), tunehub:

1. copies the model out of the trial's directory with the registry's own no-follow intake
   (:func:`tuner.serving.intake.copy_model`), so what is measured is what would be registered,
   and takes its size on disk (``model_size_mb``: the bytes of every file, 1 MB = 10^6 bytes);
2. serves that copy with the same server as ``tunehub model serve`` (:mod:`tuner.serving.server`:
   the same routes, JSON parsing and ``predict``) in a child process pinned to **one CPU**
   (``sched_setaffinity``: the last CPU this process may use) with TensorFlow's intra- and
   inter-op thread pools at 1, so every model gets the same budget whatever the machine;
3. sends ``warmup`` requests it does not count (graph tracing, first allocations), then
   ``requests`` ``POST /v1/models/NAME:predict`` requests of ``batch_size`` rows (zeros of the
   signature's shape) from ``concurrency`` keep-alive HTTP clients over a Unix socket in a
   directory only the platform can enter (no port), and records
   the latency of each from the client's side: ``serving_latency_p50_ms`` and
   ``serving_latency_p95_ms`` (nearest-rank percentiles).

A SavedModel is a program (its graph may read and write files), so the measuring server is
started like a trial, never like a part of the platform: with the environment a trial gets (the
platform's variables left out, or the owner's reduced one where people have Unix users) and as
the model's owner where there is one. A process that holds a Kubernetes ServiceAccount token
(the tuner in its pod) does not run a model at all: the graph could read the token beside it.
On Kubernetes this measurement runs instead in a measuring pod that has none
(:mod:`tuner.backends.kubernetes.measuring`, :mod:`tuner.serving.cost_report`).

Measurements in one process run one at a time (a lock), so two trials finishing together do
not share the pinned CPU. The CPU is not reserved from other work on the machine: on a busy
machine the figures include that contention (the method and the figures go together, see the
README's "Promotion under a serving budget").
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunehub_base.unix_users import UnixUser, privilege_dropper
from tuner.errors import TunehubError

#: The model name the measuring server answers to (it serves one directory).
MEASURED = "measured"
#: How long the child may take to import TensorFlow and load the model.
START_TIMEOUT = 600.0
#: Where a pod's ServiceAccount token is mounted: a process that has one runs no model.
SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
_ONE_AT_A_TIME = threading.Lock()


class CostError(TunehubError):
    """The model could not be measured; the message says why (it lands in the trial's reason)."""


@dataclass(frozen=True)
class CostMethod:
    """How a model is measured: the figures mean something only with these beside them."""

    batch_size: int = 1
    concurrency: int = 1
    warmup: int = 20
    requests: int = 200
    cpus: int = 1

    def describe(self) -> str:
        return (f"batch {self.batch_size}, concurrency {self.concurrency}, {self.warmup} "
                f"warm-up + {self.requests} timed requests, server pinned to {self.cpus} CPU")


def size_mb(path: Path) -> float:
    """Bytes of every regular file below ``path`` (a copy the platform made), in MB (10^6)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            st = os.lstat(os.path.join(root, name))
            total += st.st_size
    return total / 1e6


def budget_cpus(cpus: int) -> set[int]:
    """The CPUs the measuring server is pinned to: the last ``cpus`` this process may use."""
    allowed = sorted(os.sched_getaffinity(0))
    return set(allowed[-cpus:])


@dataclass(frozen=True)
class ModelProcess:
    """How the measuring server starts: as a trial of the model's owner would. ``env``: its
    whole environment; ``become``: makes it the owner (between fork and exec) where people
    have Unix users, so a model's graph runs with its owner's rights, never root's."""

    env: dict[str, str]
    become: Callable[[], None] | None = None

    @classmethod
    def of_owner(cls, owner: UnixUser | None) -> ModelProcess:
        """As the owner's trials start: their Unix user and its reduced environment where
        people have Unix users (``owner``), else a trial's environment (the platform's
        variables left out)."""
        from tuner.backends._base import inherited_environment

        if owner is None:
            return cls(inherited_environment())
        return cls(owner.environment(os.environ), privilege_dropper(owner))


def measure_trial_model(source: Path, trusted: Path, max_bytes: int, process: ModelProcess,
                        method: CostMethod = CostMethod()) -> dict[str, float]:
    """The serving figures of a trial's model directory ``source`` (below ``trusted``, a
    directory only the platform changes): copied in the registry's way, then measured by a
    server started as ``process`` says."""
    from tuner.serving.intake import copy_model

    scratch = Path(tempfile.mkdtemp(prefix="tunehub-cost-"))
    try:
        os.chmod(scratch, 0o755)  # readable by the owner's server; writable by root alone
        copy = scratch / "model"
        copy_model(source, copy, max_bytes, trusted)
        return measure(copy, process, method)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def measure(model_dir: Path, process: ModelProcess,
            method: CostMethod = CostMethod()) -> dict[str, float]:
    """Serve ``model_dir`` (a SavedModel the platform holds) as the module text says and
    return ``model_size_mb``, ``serving_latency_p50_ms`` and ``serving_latency_p95_ms``."""
    if SERVICE_ACCOUNT_TOKEN.exists():
        raise CostError("not measured in a process that holds a Kubernetes ServiceAccount "
                        "token: a model's graph is a program and could read it")
    with _ONE_AT_A_TIME:
        size = size_mb(model_dir)
        latencies = _timed_requests(model_dir, method, process)
    latencies.sort()
    return {
        "model_size_mb": round(size, 4),
        "serving_latency_p50_ms": round(_rank(latencies, 0.50) * 1000, 4),
        "serving_latency_p95_ms": round(_rank(latencies, 0.95) * 1000, 4),
    }


def _rank(ordered: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    index = max(0, min(len(ordered) - 1, -(-int(q * len(ordered) * 1000) // 1000) - 1))
    return ordered[index]


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over the measuring server's Unix socket."""

    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=60)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.path)
        self.sock = sock


def _timed_requests(model_dir: Path, method: CostMethod,
                    process: ModelProcess) -> list[float]:
    env = {**process.env, "TF_CPP_MIN_LOG_LEVEL": "2"}
    cpus = ",".join(str(c) for c in sorted(budget_cpus(method.cpus)))
    # The server listens on a socket this process binds in a directory of its own (mode
    # 0700) and hands over: no port anyone else on the machine could reach or take first.
    where = tempfile.mkdtemp(prefix="tunehub-cost-socket-")
    path = os.path.join(where, "server.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        listener.listen(64)
        child = subprocess.Popen(
            [sys.executable, "-m", "tuner.serving.cost", str(model_dir), cpus,
             str(listener.fileno())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
            preexec_fn=process.become, cwd="/", pass_fds=(listener.fileno(),),
        )
    finally:
        listener.close()  # the child holds it now
    try:
        hello = _first_line(child, START_TIMEOUT)
        body = json.dumps(_request_body(hello["inputs"], method.batch_size)).encode()
        for _ in range(method.warmup):
            _predict(_UnixConnection(path), body)
        per_client = [method.requests // method.concurrency] * method.concurrency
        per_client[0] += method.requests - sum(per_client)

        def client(n: int) -> list[float]:
            conn = _UnixConnection(path)
            try:
                return [_predict(conn, body) for _ in range(n)]
            finally:
                conn.close()

        with ThreadPoolExecutor(method.concurrency) as pool:
            return [t for ts in pool.map(client, per_client) for t in ts]
    finally:
        child.terminate()
        try:
            child.wait(30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        for stream in (child.stdin, child.stdout, child.stderr):
            if stream is not None:
                stream.close()
        shutil.rmtree(where, ignore_errors=True)


def _first_line(child: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
    """The child's one line: its signature's inputs (read in a thread, so a
    child that hangs is given up on)."""
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(child.stdout.readline()  # type: ignore[union-attr]
                                                        ), daemon=True)
    reader.start()
    reader.join(timeout)
    if not got or not got[0]:
        child.kill()
        err = (child.stderr.read() if child.stderr else b"").decode(errors="replace")
        tail = err.strip().splitlines()[-1:] or ["no answer"]
        raise CostError(f"the measuring server did not start: {tail[0]:.300}")
    answer: dict[str, Any] = json.loads(got[0])
    if "error" in answer:
        raise CostError(f"the model cannot be served: {answer['error']:.300}")
    return answer


def _request_body(inputs: Mapping[str, Mapping[str, Any]], batch: int) -> dict[str, Any]:
    """Zeros of the signature's shape, ``batch`` rows (an unknown dimension is 1)."""
    def zeros(shape: list[int | None]) -> Any:
        if not shape:
            return 0
        return [zeros(shape[1:]) for _ in range(shape[0] or 1)]

    arrays = {name: zeros([batch, *spec["shape"][1:]]) for name, spec in inputs.items()}
    if len(arrays) == 1:
        return {"instances": next(iter(arrays.values()))}
    return {"inputs": arrays}


def _predict(conn: http.client.HTTPConnection, body: bytes) -> float:
    started = time.perf_counter()
    conn.request("POST", f"/v1/models/{MEASURED}:predict", body,
                 {"Content-Type": "application/json"})
    response = conn.getresponse()
    payload = response.read()
    elapsed = time.perf_counter() - started
    if response.status != 200:
        raise CostError(f"the model's prediction failed ({response.status}): "
                        f"{payload.decode(errors='replace'):.300}")
    return elapsed


# --- the measuring server (the child) ---------------------------------------------------------


def _serve(model_dir: str, cpu_list: str, listener: int) -> None:
    """Pinned to ``cpu_list`` ("3" or "2,3"), one thread per pool per CPU, the serving app over
    one model on the socket it was handed (file descriptor ``listener``); says its inputs on
    stdout and serves until stdin closes or it is terminated."""
    cpus = {int(c) for c in cpu_list.split(",")}
    os.sched_setaffinity(0, cpus)
    import asyncio

    import tensorflow as tf
    import tornado.httpserver

    from tuner.serving.server import ModelServer, make_app

    tf.config.threading.set_intra_op_parallelism_threads(len(cpus))
    tf.config.threading.set_inter_op_parallelism_threads(len(cpus))

    class OneModel(ModelServer):
        """The server's routes and predict over one directory, as version 1 in production."""

        def version_for(self, stage: str) -> int:
            return 1

        def load(self, version: int) -> Any:
            if 1 not in self._loaded:
                self._loaded[1] = tf.saved_model.load(model_dir)
            return self._loaded[1]

    server = OneModel(None, MEASURED, max_client_requests=1024)  # type: ignore[arg-type]
    try:
        fn = server.load(1).signatures["serving_default"]
        specs = fn.structured_input_signature[1]
    except Exception as exc:  # a SavedModel without a serving signature: say so
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return
    inputs = {k: {"shape": v.shape.as_list(), "dtype": v.dtype.name} for k, v in specs.items()}

    async def main() -> None:
        app = make_app(None, MEASURED, server=server)  # type: ignore[arg-type]
        sock = socket.socket(fileno=listener)
        sock.setblocking(False)
        http_server = tornado.httpserver.HTTPServer(app)
        http_server.add_sockets([sock])
        print(json.dumps({"inputs": inputs}), flush=True)
        closed = asyncio.get_running_loop().run_in_executor(None, sys.stdin.buffer.read)
        await closed  # the parent went away, or closed our stdin

    asyncio.run(main())
    os._exit(0)


if __name__ == "__main__":
    _serve(sys.argv[1], sys.argv[2], int(sys.argv[3]))
