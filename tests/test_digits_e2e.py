"""The first thing a new user does: ``tunehub demo`` trains real Keras models on the digits
data, registers and promotes the best one, and ``tunehub model serve`` answers TensorFlow
Serving's REST API for it. Then promotion by hand moves the production and canary labels."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from sklearn.datasets import load_digits

from tests.conftest import Home
from tests.polling import wait_for
from tests.service_fixtures import free_port
from tests.sweeps_helpers import parse_json

pytestmark = pytest.mark.slow


@pytest.fixture
def home(sqlite_home: Home) -> Home:
    sqlite_home.extra_env["DIGITS_EPOCHS"] = "3"  # enough to learn, short enough for CI
    return sqlite_home


@pytest.fixture
def served(home: Home) -> Iterator[str]:
    """``tunehub model serve digits`` on a free port, after a demo sweep registered it."""
    demo = home.cli("demo", "--trials", "3", "--json", timeout=900)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    # TensorFlow's import chatter (the warm-start process imports it) stays off the terminal.
    assert "oneDNN" not in demo.stderr and "absl" not in demo.stderr, demo.stderr
    port = free_port()
    proc = home.popen("model", "serve", "digits", "--port", str(port))
    url = f"http://127.0.0.1:{port}/v1/models/digits"

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"model serve exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, timeout=120, what="the model server")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _digits() -> tuple[np.ndarray, np.ndarray]:
    x, y = load_digits(return_X_y=True)
    return (x / 16.0).astype("float32")[:200], y[:200]


def test_demo_promotes_a_model_that_serves_predictions(home: Home, served: str) -> None:
    versions = parse_json(home.cli("model", "show", "digits", "--json", check=True).stdout)
    assert [v["version"] for v in versions] == [1]
    v1 = versions[0]
    assert v1["stage"] == "production"
    # Laid out as TensorFlow Serving expects, with its lineage.
    assert (Path(v1["path"]) / "saved_model.pb").is_file()
    assert Path(v1["path"]).parent.name == "digits" and Path(v1["path"]).name == "1"
    sweep = parse_json(home.cli("sweep", "show", str(v1["sweep_id"]), "--json", check=True).stdout)
    assert v1["trial_number"] == sweep["best_trial"]
    assert v1["metric_value"] == pytest.approx(sweep["best_value"])
    for field in ("params", "code_location", "data_path", "created_at", "metric"):
        assert v1[field], field

    x, y = _digits()
    r = httpx.post(f"{served}:predict", json={"instances": x.tolist()}, timeout=60)
    assert r.status_code == 200, r.text
    predictions = np.array(r.json()["predictions"])
    assert predictions.shape == (200, 10)
    assert np.allclose(predictions.sum(axis=1), 1.0, atol=1e-3)  # softmax
    accuracy = float((predictions.argmax(axis=1) == y).mean())
    assert accuracy > 0.5, accuracy  # learned something: chance is 0.1

    # Columnar requests answer the same; bad requests get TF Serving's 400/404 with JSON.
    cols = httpx.post(f"{served}:predict", json={"inputs": x[:5].tolist()}, timeout=60)
    assert np.allclose(np.array(cols.json()["outputs"]), predictions[:5], atol=1e-5)
    bad = httpx.post(f"{served}:predict", content=b"{not json", timeout=10)
    assert bad.status_code == 400 and "JSON" in bad.json()["error"]
    wrong = httpx.post(f"{served}:predict", json={"instances": [[1.0, 2.0]]}, timeout=10)
    assert wrong.status_code == 400 and wrong.json()["error"]
    other = httpx.post(served.replace("digits", "nope") + ":predict", json={}, timeout=10)
    assert other.status_code == 404 and "nope" in other.json()["error"]
    assert httpx.post(f"{served}/labels/canary:predict", json={"instances": x[:1].tolist()},
                      timeout=10).status_code == 404  # no canary yet


def test_promotion_by_hand_switches_what_is_served(home: Home, served: str) -> None:
    # A second sweep registers v2; if-better promotes it only when it beats v1.
    again = home.cli("demo", "--trials", "2", "--json", timeout=900)
    assert again.returncode == 0, again.stdout + again.stderr
    versions = parse_json(home.cli("model", "show", "digits", "--json").stdout)
    by_number = {v["version"]: v for v in versions}
    assert set(by_number) == {1, 2}
    v1_better = by_number[1]["metric_value"] >= by_number[2]["metric_value"]
    assert (by_number[2]["stage"] == "production") is not v1_better
    production = 1 if v1_better else 2
    other = 3 - production

    x, _ = _digits()
    body = {"instances": x[:20].tolist()}

    def predict(path: str) -> np.ndarray:
        r = httpx.post(f"{served}{path}:predict", json=body, timeout=60)
        assert r.status_code == 200, r.text
        return np.array(r.json()["predictions"])

    assert np.allclose(predict(""), predict(f"/versions/{production}"))
    out = home.cli("model", "promote", "digits", str(other), "--stage", "canary", "--json",
                   check=True)
    assert json.loads(out.stdout)["stage"] == "canary"
    canary = wait_for(lambda: httpx.post(f"{served}/labels/canary:predict", json=body,
                                         timeout=60).status_code == 200, what="canary label")
    assert canary
    assert np.allclose(predict("/labels/canary"), predict(f"/versions/{other}"))

    home.cli("model", "promote", "digits", str(other), check=True)
    status = httpx.get(served, timeout=10).json()["model_version_status"]
    stages = {s["version"]: s["stage"] for s in status}
    assert stages[str(other)] == "production" and stages[str(production)] != "production"
    # The server picks the promotion up without a restart.
    wait_for(lambda: np.allclose(predict(""), predict(f"/versions/{other}")),
             what="the production label to move")

    # Bad input: one line, non-zero, naming the value; nothing changed.
    bad = home.cli("model", "promote", "digits", "99")
    assert bad.returncode != 0 and "99" in bad.stderr and "Traceback" not in bad.stderr
    bad = home.cli("model", "promote", "digits", "0")
    assert bad.returncode != 0 and "version" in bad.stderr
    bad = home.cli("model", "serve", "nope", "--port", str(free_port()))
    assert bad.returncode != 0 and "nope" in bad.stderr and "Traceback" not in bad.stderr
    after = parse_json(home.cli("model", "show", "digits", "--json").stdout)
    assert {v["version"]: v["stage"] for v in after}[other] == "production"


def test_training_script_runs_outside_a_sweep(tmp_path: Path) -> None:
    """Users debug the same script in a notebook or a terminal: defaults, no-op reporting."""
    script = Path(__file__).resolve().parents[1] / "examples" / "digits" / "train.py"
    env = {"DIGITS_EPOCHS": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "PATH": "/usr/bin:/bin"}
    import sys

    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "val_accuracy" in proc.stdout + proc.stderr
