"""A trial's report outlasts a tuner that is away (issue 29): killed and not yet restarted, its
port closed, the report is retried with backoff, said once on the trial's stderr, and lands
when a tuner answers on that address again; nothing is sent twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.service_fixtures import free_port

TRIAL = """\
import tuner.sdk.training as training
print("ANSWER", training._post("trials/7/report", {"value": 0.5, "step": 3}), flush=True)
"""


def test_a_report_waits_for_a_tuner_that_comes_back() -> None:
    port = free_port()
    received: list[tuple[str, str, dict[str, object]]] = []

    class Tuner(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.append((self.path, self.headers["Authorization"], body))
            answer = json.dumps({"prune": False}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            pass

    env = {**os.environ, "TUNEHUB_API_URL": f"http://127.0.0.1:{port}",
           "TUNEHUB_TRIAL_TOKEN": "t0ken", "TUNEHUB_TRIAL_ID": "7"}
    env.pop("TUNEHUB_API_SOCKET", None)
    trial = subprocess.Popen([sys.executable, "-c", TRIAL], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    server: ThreadingHTTPServer | None = None
    try:
        assert trial.stderr is not None
        said = trial.stderr.readline()  # the trial found nobody listening: it says so once
        assert "the tuner is unreachable since" in said and "retrying" in said, said
        server = ThreadingHTTPServer(("127.0.0.1", port), Tuner)  # the tuner is back
        threading.Thread(target=server.serve_forever, daemon=True).start()
        out, err = trial.communicate(timeout=60)
    finally:
        trial.kill()
        if server is not None:
            server.shutdown()
    assert trial.returncode == 0, err
    assert "ANSWER {'prune': False}" in out, out
    assert received == [("/api/v1/trials/7/report", "Bearer t0ken", {"value": 0.5, "step": 3})]
    assert "unreachable" not in err, err  # said once, not at every retry
    assert "the tuner answers again; report sent after" in err, err
