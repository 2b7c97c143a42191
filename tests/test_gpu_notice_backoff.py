"""The JupyterLab GPU-idle notice's poller backs off while its server does not answer (issue 26).

The shipped plugin (the built copy's source, ``hub/singleuser/labextension/index.js``) runs in
real Node.js against a real HTTP server standing in for the notebook server's
``tunehub/gpu-reclaim`` endpoint; the server answers, then fails (as the proxy does once the
server stopped), then answers again. Only ``setTimeout`` is recorded instead of waited on, so
each poll's next delay is read without waiting minutes; the test steps the polls itself."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

INDEX = Path(__file__).resolve().parent.parent / "hub/singleuser/labextension/index.js"

# Loads the plugin with JupyterLab's app stood in (commands answer an id), polls once per
# "poll" line on stdin, and prints after each the delay it set and the warnings so far.
DRIVER = """
const plugin = require(process.argv[2]);
const realTimeout = setTimeout;
let next = null;
const delays = [];
global.setTimeout = (fn, ms, ...args) => {
  if (fn.name !== 'poll') return realTimeout(fn, ms, ...args); // fetch's own timers
  next = fn;
  delays.push(ms);
};
global.document = { cookie: '' };
const warnings = [];
console.warn = (...args) => warnings.push(args.map(String).join(' '));
const app = {
  serviceManager: { serverSettings: { baseUrl: process.argv[3], token: 'tok' } },
  commands: { execute: async () => 'n1' },
  restored: { then: fn => { next = fn; } },
};
plugin.activate(app);
async function settle(count) {
  while (delays.length < count) await new Promise(r => realTimeout(r, 5));
}
const lines = require('readline').createInterface({ input: process.stdin });
lines.on('line', async () => {
  const fn = next;
  next = null;
  const count = delays.length + 1;
  fn();
  await settle(count);
  console.log(JSON.stringify({ delay: delays[delays.length - 1], warnings: warnings.length }));
});
"""


class _Reclaim(BaseHTTPRequestHandler):
    up = True
    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        type(self).seen.append(self.headers.get("Authorization") or "")
        if self.path != "/user/ann/tunehub/gpu-reclaim" or not type(self).up:
            self.send_response(503)
            self.end_headers()
            return
        body = json.dumps({"state": "ok", "poll_seconds": 2, "gpus": ["0"]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Reclaim)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/user/ann/"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_the_poller_doubles_its_wait_up_to_5_minutes_and_warns_once(
    server: str, tmp_path: Path,
) -> None:
    node = shutil.which("node")
    assert node, "Node.js runs the plugin"
    driver = tmp_path / "driver.js"
    driver.write_text(DRIVER)
    proc = subprocess.Popen([node, str(driver), str(INDEX), server], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None

    def poll() -> tuple[int, int]:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("poll\n")
        proc.stdin.flush()
        answer = json.loads(proc.stdout.readline())
        return int(answer["delay"]), int(answer["warnings"])

    try:
        _Reclaim.up = True
        assert poll() == (2000, 0)  # the server's period
        _Reclaim.up = False  # the server stopped: the proxy answers 503
        failing = [poll() for _ in range(10)]
        assert [d for d, _ in failing] == [4000, 8000, 16000, 32000, 64000, 128000, 256000,
                                           300000, 300000, 300000]
        assert failing[-1][1] == 1  # one warning for the whole outage
        _Reclaim.up = True
        assert poll() == (2000, 1)  # an answer: the period again
        _Reclaim.up = False
        assert poll() == (4000, 2)  # a new outage warns once more, from the period
        assert all(h == "token tok" for h in _Reclaim.seen) and len(_Reclaim.seen) == 13
    finally:
        proc.stdin.close()
        proc.kill()
        proc.wait(timeout=30)


def test_the_shipped_build_is_of_this_source() -> None:
    """The built copy JupyterLab loads was rebuilt after the back-off (README: rebuild and
    commit the built files), and its entry point names files that exist."""
    built = INDEX.parent.parent / "labextensions/tunehub-gpu-notice"
    load = json.loads((built / "package.json").read_text())["jupyterlab"]["_build"]["load"]
    assert (built / load).is_file()
    chunks = "".join(p.read_text() for p in (built / "static").glob("*.js"))
    assert "asking again less often" in chunks and "3e5" in chunks
