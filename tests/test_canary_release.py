"""Gradual release through the real ``tunehub model serve`` (issue 27): a share of the
production route goes to the canary; after enough clean answers it takes production, and a
canary that fails on some inputs is rolled back while its failed request is answered by
production. Every move is in the versions' history with its reason."""

from __future__ import annotations

import getpass
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Home
from tests.polling import wait_for
from tests.service_fixtures import free_port

pytestmark = pytest.mark.slow

SAVE = """
import sys
import tensorflow as tf

fail_above = float(sys.argv[2]) if len(sys.argv) > 2 else None

class Doubler(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
    def serve(self, x):
        if fail_above is not None:  # a model that fails on some inputs
            tf.debugging.assert_less(x, fail_above, message="input out of range")
        return {"y": x * 2.0}

m = Doubler()
tf.saved_model.save(m, sys.argv[1], signatures={"serving_default": m.serve})
"""

REGISTER = """
import json, sys
from pathlib import Path
from tunehub_base.settings import load_settings
from tuner.db import Database
from tuner.serving.registry import Registry

settings = load_settings()
registry = Registry(Database(settings.db_url), settings.registry)
row = registry.register(model="doubler", source_dir=Path(sys.argv[1]), owner=sys.argv[2],
                        metric="acc", direction="maximize", metric_value=0.9,
                        trusted=Path(sys.argv[1]).parent)
registry.promote("doubler", row.version, sys.argv[3], is_admin=True, reason="by the test")
print(row.version)
"""


def _python(home: Home, script: str, *args: str) -> str:
    proc = subprocess.run([_interpreter(), "-c", script, *args], env=home.env, text=True,
                          capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


def _interpreter() -> str:
    import sys

    return sys.executable


def _version(home: Home, tmp_path: Path, name: str, stage: str,
             fail_above: float | None = None) -> int:
    model = tmp_path / "models" / name
    model.parent.mkdir(exist_ok=True)
    _python(home, SAVE, str(model), *([str(fail_above)] if fail_above is not None else []))
    return int(_python(home, REGISTER, str(model), getpass.getuser(), stage))


def _versions(home: Home) -> dict[int, dict[str, Any]]:
    shown = home.cli("model", "show", "doubler", "--json", check=True).stdout
    return {v["version"]: v for v in json.loads(shown)}


@pytest.fixture
def serve(sqlite_home: Home) -> Iterator[Any]:
    procs: list[subprocess.Popen[str]] = []

    def start(*flags: str) -> str:
        port = free_port()
        proc = sqlite_home.popen("model", "serve", "doubler", "--port", str(port), *flags)
        procs.append(proc)
        url = f"http://127.0.0.1:{port}/v1/models/doubler"

        def up() -> bool:
            if proc.poll() is not None:
                said = proc.stderr.read() if proc.stderr else ""
                raise AssertionError(f"model serve exited: {said}")
            try:
                return httpx.get(url, timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, timeout=300, what="the model server")
        return url

    try:
        yield start
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=60)


def _predict(url: str, value: float) -> list[float]:
    r = httpx.post(f"{url}:predict", json={"instances": [[value] * 4]}, timeout=120)
    assert r.status_code == 200, r.text
    return list(r.json()["predictions"][0])


def test_a_canary_is_rolled_forward_after_clean_traffic_and_back_on_errors(
    sqlite_home: Home, tmp_path: Path, serve: Any,
) -> None:
    v1 = _version(sqlite_home, tmp_path, "v1", "production")
    v2 = _version(sqlite_home, tmp_path, "v2", "canary")
    url = serve("--canary-share", "0.5", "--canary-requests", "3")

    # Every second request of the production route goes to the canary: after three clean
    # answers (six requests) v2 holds production and v1 is archived, both saying why.
    for _ in range(6):
        assert _predict(url, 1.0) == [2.0] * 4
    versions = _versions(sqlite_home)
    assert (versions[v1]["stage"], versions[v2]["stage"]) == ("archived", "production")
    assert versions[v2]["history"][-1]["stage"] == "production"
    assert versions[v2]["history"][-1]["reason"] == (
        "canary v2: 3 requests answered, 0 errors (at most 0 allowed): rolled forward")
    assert versions[v1]["history"][-1]["reason"].startswith("v2 took production: canary v2")

    # A canary that fails on inputs of 5 and more: the request it fails is answered by
    # production (the client sees 200 and production's answer), and it is rolled back.
    v3 = _version(sqlite_home, tmp_path, "v3", "canary", fail_above=5.0)
    wait_for(lambda: httpx.post(f"{url}/labels/canary:predict",
                                json={"instances": [[1.0] * 4]}, timeout=120).status_code == 200,
             timeout=60, what="the server to see the new canary")
    for _ in range(4):
        assert _predict(url, 9.0) == [18.0] * 4
    versions = _versions(sqlite_home)
    assert versions[v3]["stage"] == "archived" and versions[v2]["stage"] == "production"
    reason = versions[v3]["history"][-1]["reason"]
    assert reason.startswith("canary v3 rolled back: 1 errors in 1 requests; last: "), reason
    assert "input out of range" in reason
    # Production keeps answering, the rolled-back canary is no longer asked.
    assert _predict(url, 9.0) == [18.0] * 4
