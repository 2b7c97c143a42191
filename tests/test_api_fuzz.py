"""schemathesis drives the tuner's own OpenAPI document against a real ``tunehub up``: no
request it can make gets a 5xx, every status is one the document lists, every body matches the
documented schema. Deterministic (fixed seed, no example database, bounded examples), so a
finding here is a finding every time; longer runs with other seeds are done by hand
(``schemathesis run .../openapi.json --seed N -n 1000``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.hub_fixtures import Platform
from tests.polling import wait_for
from tests.sweeps_helpers import MINIMAL_SAVED_MODEL
from tests.test_hub_platform import login_token

pytestmark = [pytest.mark.slow]

SCHEMATHESIS = str(Path(sys.executable).parent / "schemathesis")
CHECKS = "not_a_server_error,status_code_conformance,response_schema_conformance"
TRAIN = f"""\
import os, pathlib, tuner
p = tuner.params()
model = pathlib.Path(os.environ["TUNEHUB_ARTIFACT_DIR"]) / "model"
model.mkdir(parents=True, exist_ok=True)
(model / "saved_model.pb").write_bytes({MINIMAL_SAVED_MODEL!r})
tuner.report(p["x"], step=1)
tuner.report(p["x"])
"""


def test_schemathesis_finds_nothing(platform: Platform, tmp_path: Path) -> None:
    platform.start()
    assert platform.password, platform.output
    admin = httpx.Client(base_url=platform.url + "hub/api/", timeout=60, headers={
        "Authorization": f"token {login_token(platform.url, 'admin', platform.password)}"})
    assert admin.post("users/alice").status_code == 201
    token = admin.post("users/alice/tokens", json={"note": "fuzz"}).json()["token"]
    api = httpx.Client(base_url=platform.url + "services/tuner/api/v1/", timeout=60,
                       headers={"Authorization": f"token {token}"})

    # Something to find: a completed sweep with a model (ids 1 and up), a failed one.
    code = platform.data / "proj"
    code.mkdir()
    (code / "train.py").write_text(TRAIN)
    base = {"code": str(code), "metric": "m", "trials": 2,
            "space": {"x": {"type": "float", "low": 0, "high": 1}}}
    ids = [
        api.post("sweeps", json={"spec": {**base, "name": "ok", "command": "python train.py",
                                          "promote": {"model": "m1", "policy": "always"}}}),
        api.post("sweeps", json={"spec": {**base, "name": "bad", "command": "python no.py"}}),
    ]
    assert [r.status_code for r in ids] == [201, 201], [r.text for r in ids]
    for r in ids:
        wait_for(lambda sid=r.json()["id"]: api.get(f"sweeps/{sid}").json()["state"]
                 in ("completed", "failed"), timeout=120, what="the seed sweeps")

    run = subprocess.run(
        [SCHEMATHESIS, "run", f"{platform.url}services/tuner/api/v1/openapi.json",
         "-H", f"Authorization: token {token}", "--checks", CHECKS,
         "--seed", "20261123", "--max-examples", "40", "--workers", "1",
         "--generation-database", "none", "--request-timeout", "30", "--no-color"],
        capture_output=True, text=True, timeout=170, cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
    assert "passed" in run.stdout and "FAILURES" not in run.stdout, run.stdout[-4000:]
