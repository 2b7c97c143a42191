"""``tunehub model serve`` stops at Ctrl-C at once, even with a prediction still running.

Under load, the README demo's Ctrl-C once took over a minute: the predictions ran in the event
loop's default executor, whose running work ``asyncio.run`` waits for before it stops (and the
interpreter joins its threads at exit). The model here spins in a loop for as many iterations as
its input asks, so a prediction is running for minutes when the server is interrupted."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import Home
from tests.polling import wait_for
from tests.service_fixtures import free_port
from tests.test_canary_release import _python, _register

pytestmark = pytest.mark.slow

SPIN = """
import sys
import tensorflow as tf

class Spinner(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.float32)])
    def serve(self, x):
        n = tf.cast(tf.reduce_max(x), tf.int64)
        i = tf.while_loop(lambda i: i < n, lambda i: i + 1, [tf.constant(0, tf.int64)])
        return {"y": x + tf.cast(i, tf.float32) * 0.0}

m = Spinner()
tf.saved_model.save(m, sys.argv[1], signatures={"serving_default": m.serve})
"""


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks


def test_ctrl_c_stops_the_server_while_a_prediction_runs(sqlite_home: Home,
                                                         tmp_path: Path) -> None:
    model = tmp_path / "spinner"
    _python(sqlite_home, SPIN, str(model))
    _register(sqlite_home, model, "production", name="spinner")
    port = free_port()
    proc = sqlite_home.popen("model", "serve", "spinner", "--port", str(port))
    url = f"http://127.0.0.1:{port}/v1/models/spinner"
    try:
        def up() -> bool:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                return httpx.get(url, timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, timeout=300, what="the model server")
        # A quick prediction first: the model is loaded, so what runs next is the loop.
        quick = httpx.post(f"{url}:predict", json={"instances": [[1.0]]}, timeout=300)
        assert quick.status_code == 200, quick.text
        answered: list[object] = []

        def ask() -> None:
            try:
                answered.append(httpx.post(f"{url}:predict", json={"instances": [[1e12]]},
                                           timeout=600))
            except httpx.HTTPError as exc:
                answered.append(exc)

        asker = threading.Thread(target=ask, daemon=True)
        before = _cpu_seconds(proc.pid)
        asker.start()
        wait_for(lambda: _cpu_seconds(proc.pid) > before + 2, timeout=120,
                 what="the long prediction to be running")
        proc.send_signal(signal.SIGINT)
        interrupted = time.monotonic()
        proc.wait(timeout=60)
        stopped_in = time.monotonic() - interrupted
        assert proc.returncode == 130, proc.stderr.read() if proc.stderr else ""
        assert stopped_in < 20, f"Ctrl-C took {stopped_in:.1f} s with a prediction running"
        asker.join(timeout=30)
        # Its client gets no prediction (an error, or the connection closed).
        assert len(answered) == 1 and (isinstance(answered[0], httpx.HTTPError) or
                                       answered[0].status_code >= 500), answered
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
