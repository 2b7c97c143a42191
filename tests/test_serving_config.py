"""Serving follows promotions: every stage change (CLI, REST API, a sweep's policy) rewrites the
TensorFlow Serving model config in the registry, parsed here with TensorFlow Serving's own
``ModelServerConfig`` message (protobuf text format, as ``--model_config_file`` reads it)."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from tests.conftest import Home
from tests.polling import wait_for
from tests.service_fixtures import TunerHub, free_port
from tests.serving_helpers import served
from tests.sweeps_helpers import MINIMAL_SAVED_MODEL
from tuner.db import Database
from tuner.serving.models_config import CONFIG_NAME
from tuner.serving.registry import Registry


def register(registry: Registry, model: str, owner: str, tmp: Path, count: int) -> None:
    """``count`` versions of ``model`` (a SavedModel directory each; not loaded here)."""
    src = tmp / f"src-{model}"
    src.mkdir(exist_ok=True)
    (src / "saved_model.pb").write_bytes(MINIMAL_SAVED_MODEL)
    for _ in range(count):
        registry.register(model=model, source_dir=src, owner=owner, metric="acc",
                          direction="maximize", metric_value=0.5)


def test_cli_promotions_move_the_stable_and_canary_labels(
    sqlite_home: Home, tmp_path: Path
) -> None:
    user = "ana"
    sqlite_home.extra_env["TUNEHUB_USER"] = user
    sqlite_home.extra_env["TUNEHUB_SERVING_ROOT"] = "/models"  # where serving mounts them
    assert sqlite_home.cli("model", "list").returncode == 0  # creates the database
    root = sqlite_home.path / "data" / "models"
    registry = Registry(Database(sqlite_home.db_url), root)
    register(registry, "digits", user, tmp_path, 3)
    register(registry, "other", user, tmp_path, 1)
    config = root / CONFIG_NAME

    def promote(*args: str) -> None:
        sqlite_home.cli("model", "promote", *args, check=True)

    promote("digits", "1")
    assert served(config) == {"digits": {"base_path": "/models/digits", "versions": [1],
                                         "labels": {"stable": 1}}}
    before = config.stat().st_ino
    promote("digits", "2", "--stage", "canary")
    assert served(config)["digits"] == {"base_path": "/models/digits", "versions": [1, 2],
                                        "labels": {"stable": 1, "canary": 2}}
    assert config.stat().st_ino != before  # replaced by a rename, never rewritten in place
    promote("digits", "2")  # the canary becomes production: no canary left
    # v1 stays loaded, unlabelled: TensorFlow Serving moves `stable` only to a loaded
    # version, so until v2 is up the label keeps answering from v1.
    assert served(config)["digits"] == {"base_path": "/models/digits", "versions": [1, 2],
                                        "labels": {"stable": 2}}
    promote("digits", "3", "--stage", "canary")
    promote("other", "1", "--stage", "canary")
    assert served(config) == {
        "digits": {"base_path": "/models/digits", "versions": [1, 2, 3],
                   "labels": {"stable": 2, "canary": 3}},
        "other": {"base_path": "/models/other", "versions": [1], "labels": {"canary": 1}},
    }
    # A refused promotion changes nothing; the directory holds no half-written files.
    text = config.read_text()
    bad = sqlite_home.cli("model", "promote", "digits", "9")
    assert bad.returncode != 0 and "9" in bad.stderr and "Traceback" not in bad.stderr
    assert config.read_text() == text
    assert sorted(p.name for p in root.iterdir() if p.is_file()) == [
        f".{CONFIG_NAME}.lock", CONFIG_NAME]
    assert oct(config.stat().st_mode & 0o777) == oct(0o644)


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_api_promotion_moves_the_labels_only_for_the_owner(
    tuner_hub: TunerHub, db_url: str, tmp_path: Path
) -> None:
    root = tuner_hub.data / "models"
    config = root / CONFIG_NAME
    # The tuner writes the file when it starts, so TensorFlow Serving has one to read.
    assert served(config) == {}
    registry = Registry(Database(db_url), root)
    register(registry, "mnist", "alice", tmp_path, 2)
    scopes = ["custom:tuner:read", "custom:tuner:submit", "access:services!service=tuner"]
    alice = tuner_hub.client(tuner_hub.token("alice", scopes))
    bob = tuner_hub.client(tuner_hub.token("bob", scopes))

    r = bob.post("models/mnist/versions/1/promote", json={"stage": "production"})
    assert r.status_code == 404, r.text
    assert served(config) == {}
    r = alice.post("models/mnist/versions/1/promote", json={"stage": "production"})
    assert r.status_code == 200, r.text
    r = alice.post("models/mnist/versions/2/promote", json={"stage": "canary"})
    assert r.status_code == 200, r.text
    assert served(config) == {"mnist": {"base_path": str(root / "mnist"), "versions": [1, 2],
                                        "labels": {"stable": 1, "canary": 2}}}
    r = alice.post("models/mnist/versions/2/promote", json={"stage": "nightly"})
    assert r.status_code == 400 and "stage" in r.json()["error"]
    assert served(config)["mnist"]["labels"] == {"stable": 1, "canary": 2}


def test_model_serve_status_by_label(sqlite_home: Home, tmp_path: Path) -> None:
    """``tunehub model serve`` answers TensorFlow Serving's label routes like the config says."""
    sqlite_home.extra_env["TUNEHUB_USER"] = "ana"
    assert sqlite_home.cli("model", "list").returncode == 0
    root = sqlite_home.path / "data" / "models"
    register(Registry(Database(sqlite_home.db_url), root), "digits", "ana", tmp_path, 2)
    sqlite_home.cli("model", "promote", "digits", "1", check=True)
    sqlite_home.cli("model", "promote", "digits", "2", "--stage", "canary", check=True)
    port = free_port()
    proc = sqlite_home.popen("model", "serve", "digits", "--port", str(port))
    url = f"http://127.0.0.1:{port}/v1/models/digits"

    def status(path: str) -> httpx.Response | None:
        if proc.poll() is not None:
            raise AssertionError(proc.stderr.read() if proc.stderr else "model serve exited")
        try:
            return httpx.get(url + path, timeout=5)
        except httpx.HTTPError:
            return None

    try:
        wait_for(lambda: status(""), timeout=60, what="model serve")
        labels = served(root / CONFIG_NAME)["digits"]["labels"]
        for label, version in labels.items():
            r = status(f"/labels/{label}")
            assert r is not None and r.status_code == 200, r and r.text
            assert [s["version"] for s in r.json()["model_version_status"]] == [str(version)]
        r = status("/labels/nightly")
        assert r is not None and r.status_code == 400 and "nightly" in r.json()["error"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert os.path.exists(root / CONFIG_NAME)
