"""The report endpoint accepts only the token of the trial's running attempt; bad requests get
a 4xx JSON answer naming the problem."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import Home
from tests.sweeps_helpers import parse_json, write_sweep

PROBE = """
import json, os, pathlib, urllib.request, urllib.error, tuner

def post(trial_id, token, body):
    url = os.environ["TUNEHUB_API_URL"] + f"api/v1/trials/{trial_id}/report"
    req = urllib.request.Request(url, data=body, method="POST", headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())

me = int(os.environ["TUNEHUB_TRIAL_ID"])
token = os.environ["TUNEHUB_TRIAL_TOKEN"]
good = json.dumps({"value": 0.5, "step": 1, "attempt": 1}).encode()
results = {
    "wrong_token": post(me, "not-the-token", good),
    "other_trial": post(me + 1000, token, good),
    "not_json": post(me, token, b"{oops"),
    "bad_value": post(me, token, json.dumps({"value": "high"}).encode()),
    "bad_step": post(me, token, json.dumps({"value": 1, "step": -3}).encode()),
    "stale_attempt": post(me, token, json.dumps({"value": 1, "attempt": 7}).encode()),
    "ok": post(me, token, good),
}
pathlib.Path(os.environ["RECORD"]).write_text(json.dumps(results))
tuner.report(0.5)
"""


def test_report_endpoint_checks_tokens_and_input(sqlite_home: Home, tmp_path: Path) -> None:
    record = tmp_path / "record.json"
    sqlite_home.extra_env["RECORD"] = str(record)
    spec = write_sweep(tmp_path / "code", PROBE, trials=1, parallelism=1)
    out = parse_json(sqlite_home.cli("sweep", "run", str(spec), "--wait", "--json").stdout)
    assert out["state"] == "completed"
    results = json.loads(record.read_text())
    assert results["ok"] == [200, {"prune": False, "batch_seconds": 1.0}]
    assert results["wrong_token"][0] == 401
    assert "no running attempt of this trial takes this token" in results["wrong_token"][1]["error"]
    assert results["other_trial"][0] == 401
    assert results["not_json"] == [400, {"status": 400, "error": "body: not valid JSON",
                                         "field": "body"}]
    assert results["bad_value"][0] == 400 and results["bad_value"][1]["field"] == "value"
    assert results["bad_step"][0] == 400 and results["bad_step"][1]["field"] == "step"
    assert results["stale_attempt"][0] == 401
    # The accepted report was stored; the refused ones were not.
    shown = parse_json(sqlite_home.cli("sweep", "show", str(out["id"]), "--json").stdout)
    assert shown["trials_detail"][0]["intermediate_values"] == [{"step": 1, "value": 0.5}]


def test_training_script_runs_outside_a_sweep(tmp_path: Path) -> None:
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(
        "import tuner\np = tuner.params({'lr': 0.1})\nassert not tuner.in_trial()\n"
        "tuner.report(0.9, step=1)\nprint('ok', p)\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("TUNEHUB_")}
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok {'lr': 0.1}"
