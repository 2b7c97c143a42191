"""Gradual release through the real ``tunehub model serve`` (issue 27): a share of the
production route goes to the canary; after enough clean answers (or enough time,
``--canary-seconds``) it takes production, a canary that fails on some inputs is rolled back
while its failed request is answered by production, and so is one slower than its latency
bound. Every move is in the versions' history with its reason."""

from __future__ import annotations

import getpass
import json
import re
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
row = registry.register(model=sys.argv[4], source_dir=Path(sys.argv[1]), owner=sys.argv[2],
                        metric="acc", direction="maximize", metric_value=0.9,
                        trusted=Path(sys.argv[1]).parent)
registry.promote(sys.argv[4], row.version, sys.argv[3], is_admin=True, reason="by the test")
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
    return _register(home, model, stage)


def _register(home: Home, model: Path, stage: str, name: str = "doubler") -> int:
    return int(_python(home, REGISTER, str(model), getpass.getuser(), stage, name))


@pytest.fixture(scope="module")
def doubler(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One SavedModel of the doubler, registered as several versions by the tests below."""
    model = tmp_path_factory.mktemp("doubler") / "model"
    proc = subprocess.run([_interpreter(), "-c", SAVE, str(model)], text=True,
                          capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return model


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


def _stage(url: str, version: int) -> str:
    """The version's stage as the server reports it (read from the registry, not cached)."""
    r = httpx.get(f"{url}/versions/{version}", timeout=30)
    assert r.status_code == 200, r.text
    return str(r.json()["model_version_status"][0]["stage"])


def test_a_canary_is_rolled_forward_by_time_before_its_count(
    sqlite_home: Home, tmp_path: Path, serve: Any, doubler: Path,
) -> None:
    v1 = _register(sqlite_home, doubler, "production")
    v2 = _register(sqlite_home, doubler, "canary")
    # A count it never reaches: only the time rule can move it.
    url = serve("--canary-share", "1", "--canary-requests", "1000", "--canary-seconds", "2")

    assert _predict(url, 1.0) == [2.0] * 4  # the canary's one clean answer starts its clock
    # No more traffic: the server's clock moves it once two seconds have passed.
    wait_for(lambda: _stage(url, v2) == "production", timeout=120,
             what="the canary to take production by time")
    versions = _versions(sqlite_home)
    assert (versions[v1]["stage"], versions[v2]["stage"]) == ("archived", "production")
    reason = versions[v2]["history"][-1]["reason"]
    said = re.fullmatch(r"canary v2: (\d+\.\d) s of traffic \(at least 2 s\), 1 requests "
                        r"answered, 0 errors \(at most 0 allowed\): rolled forward", reason)
    assert said is not None, reason
    assert float(said.group(1)) >= 2.0
    assert versions[v1]["history"][-1]["reason"] == f"v2 took production: {reason}"
    assert _predict(url, 1.0) == [2.0] * 4  # v2 answers as production now


def test_a_canary_over_its_latency_bound_is_rolled_back_with_both_figures(
    sqlite_home: Home, tmp_path: Path, serve: Any, doubler: Path,
) -> None:
    v1 = _register(sqlite_home, doubler, "production")
    v2 = _register(sqlite_home, doubler, "canary")
    # A bound no real answer meets (a microsecond): the canary is correct but too slow.
    url = serve("--canary-share", "1", "--canary-requests", "3", "--canary-latency-ms", "0.001")

    for _ in range(3):  # every request to the canary; each answered (200) and timed
        assert _predict(url, 1.0) == [2.0] * 4
    versions = _versions(sqlite_home)
    assert (versions[v1]["stage"], versions[v2]["stage"]) == ("production", "archived")
    reason = versions[v2]["history"][-1]["reason"]
    said = re.fullmatch(r"canary v2 rolled back: p95 latency (\d+\.\d) ms over 3 requests is "
                        r"over the bound of 0.001 ms", reason)
    assert said is not None, reason
    assert float(said.group(1)) > 0.001
    assert versions[v1]["history"][-1]["stage"] == "production"  # production never moved
    # No canary left: production answers the route, the canary label is gone.
    assert _predict(url, 1.0) == [2.0] * 4
    assert httpx.get(f"{url}/labels/canary", timeout=30).status_code == 404
