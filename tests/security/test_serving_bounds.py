"""#31 item 3 (requests) for ``tunehub model serve``: one client cannot stall or starve the model
server for everyone else.

A real ``tunehub model serve`` process serving a real SavedModel (whose prediction takes as long
as its input asks), with small bounds: a body over ``TUNEHUB_API_MAX_BODY``, declared or chunked,
is a 413 naming the limit; JSON too deep or with too many values is a 400 naming its limit (never
a 500, never parsed); and one client address with ``TUNEHUB_SERVE_MAX_CLIENT_REQUESTS``
predictions in flight gets a 429 for the next one, while another client is answered."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import TUNEHUB
from tests.polling import wait_for
from tests.service_fixtures import free_port
from tuner.db import Database
from tuner.serving.registry import Registry

pytestmark = [pytest.mark.slow]

MAX_BODY = 64 * 1024
MAX_DEPTH = 8
MAX_ITEMS = 1000
PER_CLIENT = 2

#: A SavedModel whose ``serving_default`` multiplies a 64×64 matrix ``x[0]`` times: its input
#: chooses how long a prediction holds a worker.
SLOW_MODEL = """
import sys, tensorflow as tf

class Slow(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def serve(self, x):
        m = tf.eye(64)
        _, acc = tf.while_loop(lambda i, a: i < tf.cast(x[0], tf.int32),
                               lambda i, a: (i + 1, tf.linalg.matmul(a, m)), [0, m])
        return {"y": x + 0.0 * tf.reduce_sum(acc)}

slow = Slow()
tf.saved_model.save(slow, sys.argv[1], signatures={"serving_default": slow.serve})
"""


@dataclass
class Served:
    url: str  # .../v1/models/slow
    process: subprocess.Popen[bytes]
    log: Path

    def predict(self, body: bytes | Iterator[bytes], client: httpx.Client | None = None,
                timeout: float = 120) -> httpx.Response:
        headers = {"Content-Type": "application/json"}
        if client is not None:
            return client.post(f"{self.url}:predict", content=body, headers=headers)
        return httpx.post(f"{self.url}:predict", content=body, headers=headers,
                          timeout=timeout)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    home, db_url = tmp_path / "home", f"sqlite:///{tmp_path / 'tunehub.sqlite'}"
    model = tmp_path / "slow"
    subprocess.run([sys.executable, "-c", SLOW_MODEL, str(model)], check=True, timeout=300,
                   env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    env = {"TUNEHUB_HOME": str(home), "TUNEHUB_DB_URL": db_url, "TUNEHUB_LOCAL_GPUS": "",
           "TF_CPP_MIN_LOG_LEVEL": "2", "TUNEHUB_USER": "ana",
           "TUNEHUB_API_MAX_BODY": str(MAX_BODY), "TUNEHUB_API_MAX_JSON_DEPTH": str(MAX_DEPTH),
           "TUNEHUB_API_MAX_JSON_ITEMS": str(MAX_ITEMS),
           "TUNEHUB_SERVE_MAX_CLIENT_REQUESTS": str(PER_CLIENT)}
    env = {**os.environ, **env}
    subprocess.run([TUNEHUB, "model", "list"], env=env, check=True, capture_output=True,
                   timeout=300)  # creates the database
    registry = Registry(Database(db_url), home / "data" / "models")
    registry.register(model="slow", source_dir=model, owner="ana", metric="acc",
                      direction="maximize", metric_value=0.5)
    registry.promote("slow", 1, actor="ana")
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([TUNEHUB, "model", "serve", "slow", "--port", str(port)],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1/models/slow"

    def up() -> bool:
        assert proc.poll() is None, log.read_text()
        try:
            return httpx.get(url, timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, timeout=120, what="tunehub model serve")
        yield Served(url, proc, log)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _chunks(total: int) -> Iterator[bytes]:
    yield b'{"instances": ['
    sent = 0
    while sent < total:
        yield b"1.0, " * 1000
        sent += 5000
    yield b"1.0]}"


def test_bodies_over_the_bounds_are_refused_naming_the_limit(served: Served) -> None:
    ok = served.predict(b'{"instances": [1.0, 2.0]}')
    assert ok.status_code == 200 and ok.json() == {"predictions": [1.0, 2.0]}, ok.text
    # Over the size bound, with its length declared and chunked (a generator: no length).
    declared = b'{"instances": [' + b"1.0, " * (MAX_BODY // 5 + 10) + b"1.0]}"
    for body in (declared, _chunks(8 * MAX_BODY)):
        r = served.predict(body)
        assert r.status_code == 413, r.text[:300]
        assert r.json()["field"] == "body" and "TUNEHUB_API_MAX_BODY" in r.json()["error"]
    # Too deep, too many values, not JSON: a 400 naming the bound (a 500 or a parse before).
    deep = b'{"instances": ' + b"[" * 20 + b"1" + b"]" * 20 + b"}"
    wide = b'{"instances": [' + b"0," * (MAX_ITEMS + 5) + b"0]}"
    for body, words in ((deep, "TUNEHUB_API_MAX_JSON_DEPTH"),
                        (wide, "TUNEHUB_API_MAX_JSON_ITEMS"), (b"{oops", "not valid JSON")):
        r = served.predict(body)
        assert r.status_code == 400 and words in r.json()["error"], (words, r.text[:300])
    assert served.predict(b'{"instances": [1.0]}').status_code == 200  # still serving


def _slow_enough(served: Served, seconds: float = 12.0) -> float:
    """Iterations that make a prediction take about ``seconds`` here.

    Measured after a warm-up prediction: the first one also loads the SavedModel and traces its
    function, so timing it would make the holders below far too short (their predictions could
    end before the check sees both in flight)."""
    assert served.predict(b'{"instances": [1.0]}').status_code == 200  # load and trace
    n = 20000.0
    while True:
        began = time.monotonic()
        assert served.predict(b'{"instances": [%f]}' % n).status_code == 200
        took = time.monotonic() - began
        if took >= 1.0:
            return n * seconds / took
        n *= 4


def _hold(served: Served, iterations: float
          ) -> tuple[list[threading.Thread], list[int | str]]:
    """``PER_CLIENT`` slow predictions from this client, running in threads."""
    statuses: list[int | str] = []

    def hold() -> None:
        # As long as it takes: on a machine busier than at the calibration (the suite's other
        # worker) a held prediction runs several times its calibrated seconds.
        try:
            r = served.predict(b'{"instances": [%f]}' % iterations, timeout=900)
        except httpx.HTTPError as exc:
            statuses.append(f"{type(exc).__name__}: {exc}")
        else:
            statuses.append(r.status_code)

    holders = [threading.Thread(target=hold) for _ in range(PER_CLIENT)]
    for t in holders:
        t.start()
    return holders, statuses


def test_one_client_cannot_hold_every_prediction(served: Served) -> None:
    iterations = _slow_enough(served)

    def refused() -> httpx.Response | None:
        r = served.predict(b'{"instances": [1.0]}')
        return r if r.status_code == 429 else None

    # Once the client's allowance is in flight, its next prediction is refused at once. The
    # 429 itself proves both holders were in flight; holders that ended before a look saw
    # them (a machine whose speed changed since the calibration) are tried again, longer.
    for _ in range(3):
        holders, statuses = _hold(served, iterations)
        seen = wait_for(lambda h=holders: refused() or not any(t.is_alive() for t in h),
                        timeout=120, what="the allowance in flight or the holders done")
        if isinstance(seen, httpx.Response):
            late = seen
            break
        for t in holders:
            t.join(timeout=900)
        iterations *= 4
    else:
        raise AssertionError("the holders always ended before their allowance was seen in flight")
    try:
        assert "TUNEHUB_SERVE_MAX_CLIENT_REQUESTS" in late.json()["error"], late.text
        # ... while another client (another address) is answered, not refused.
        other = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"),
                             timeout=300)
        with other:
            r = served.predict(b'{"instances": [1.0]}', other)
        assert r.status_code == 200, r.text
    finally:
        for t in holders:
            t.join(timeout=900)
    assert statuses == [200] * PER_CLIENT
    # Their answers free the allowance.
    assert served.predict(b'{"instances": [1.0]}').status_code == 200
