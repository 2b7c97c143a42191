"""Several intermediate values in one report (issue 30): a trial of a sweep that never prunes
holds its values up to ``TUNEHUB_REPORT_BATCH_SECONDS`` and sends them together; a sweep that
prunes answers each value at once; a batch sent to a pruning sweep is judged step by step and
its answer names the step the trial is pruned at. Real trials, real HTTP, SQLite."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import Home
from tests.sweeps_helpers import TRIAL_POST, parse_json, write_sweep

# Counts the requests the SDK makes while it reports 60 steps as fast as it can, then checks
# that a checkpoint leaves nothing held.
HOLDS = """
import json, os, pathlib, tuner
import tuner.sdk.training as sdk

sent = []
post = sdk._post
def counting(path, body):
    sent.append(len(body.get("steps", [None])))
    return post(path, body)
sdk._post = counting
for step in range(30):
    tuner.report(step / 100, step=step)
tuner.checkpoint({"epoch": 30}, 30)
held_after_checkpoint = len(sdk._held.steps)
for step in range(30, 60):
    tuner.report(step / 100, step=step)
tuner.report(0.6)
pathlib.Path(os.environ["RECORD_DIR"], os.environ["TUNEHUB_TRIAL_ID"]).write_text(json.dumps(
    {"sent": sent, "held_after_checkpoint": held_after_checkpoint}))
"""


def _record(tmp_path: Path, home: Home) -> Path:
    record = tmp_path / "record"
    record.mkdir()
    home.extra_env["RECORD_DIR"] = str(record)
    return record


def test_a_sweep_that_never_prunes_gets_its_values_in_few_requests(
        sqlite_home: Home, tmp_path: Path) -> None:
    record = _record(tmp_path, sqlite_home)
    spec = write_sweep(tmp_path / "code", HOLDS, trials=1, parallelism=1, pruner="none")
    proc = sqlite_home.cli("sweep", "run", str(spec), "--wait", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = parse_json(proc.stdout)
    assert out["state"] == "completed", out
    seen = json.loads(next(record.iterdir()).read_text())
    # The first value goes alone (the tuner has not said yet that values may be held); the
    # other 59 travel in a few batches (one per second at most, and one at the checkpoint),
    # then the final result alone.
    assert seen["held_after_checkpoint"] == 0
    batches = seen["sent"][1:-1]
    assert seen["sent"][0] == 1 and sum(batches) == 59, seen
    assert len(batches) <= 6, seen
    # Nothing lost, nothing out of order.
    trial = out["trials_detail"][0]
    assert trial["intermediate_values"] == [{"step": s, "value": s / 100} for s in range(60)]
    assert trial["value"] == 0.6


def test_a_sweep_that_prunes_answers_every_value_at_once(
        sqlite_home: Home, tmp_path: Path) -> None:
    record = _record(tmp_path, sqlite_home)
    spec = write_sweep(tmp_path / "code", HOLDS, trials=1, parallelism=1,
                       pruner={"type": "median", "n_startup_trials": 1, "min_trials": 1})
    proc = sqlite_home.cli("sweep", "run", str(spec), "--wait", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(next(record.iterdir()).read_text())
    assert seen["sent"] == [1] * 61, seen


# Trial 0 reports a rising curve, its step at each of 10 steps; trial 1 tries a few malformed
# batches, then posts one batch of 10 steps that follows the curve up to step 4 and stays at 4
# (Optuna's median pruner compares a trial's best value so far with the median of the others
# at that step: from step 5 on, 4 is worse than the only other trial's).
BATCH = TRIAL_POST + """
import pathlib, tuner

if os.environ["TUNEHUB_TRIAL_NUMBER"] == "0":
    for step in range(10):
        tuner.report(float(step), step=step)
    tuner.report(9.0)
else:
    results = {
        "empty": post({"steps": []}),
        "bad_item": post({"steps": [{"step": 0, "value": 1.0}, {"step": -1, "value": 1.0}]}),
        "with_value": post({"steps": [{"step": 0, "value": 1.0}], "value": 1.0}),
        "batch": post({"steps": [{"step": s, "value": float(min(s, 4))} for s in range(10)]}),
    }
    pathlib.Path(os.environ["RECORD_DIR"], "batch").write_text(json.dumps(results))
"""


def test_a_batch_is_judged_step_by_step_and_stops_where_it_is_pruned(
        sqlite_home: Home, tmp_path: Path) -> None:
    record = _record(tmp_path, sqlite_home)
    spec = write_sweep(tmp_path / "code", BATCH, trials=2, parallelism=1,
                       pruner={"type": "median", "n_startup_trials": 1, "min_trials": 1})
    proc = sqlite_home.cli("sweep", "run", str(spec), "--wait", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = parse_json(proc.stdout)
    results = json.loads((record / "batch").read_text())
    assert results["empty"][0] == 400 and results["empty"][1]["field"] == "steps"
    assert results["bad_item"][0] == 400 and results["bad_item"][1]["field"] == "steps[1]"
    assert results["with_value"][0] == 400 and results["with_value"][1]["field"] == "value"
    assert results["batch"] == [200, {"prune": True, "step": 5, "batch_seconds": 0.0}]
    pruned = next(t for t in out["trials_detail"] if t["number"] == 1)
    assert pruned["state"] == "pruned", pruned
    # The steps after the one it was pruned at were not taken (it would not have made them).
    assert [v["step"] for v in pruned["intermediate_values"]] == list(range(6))


# Ends on an intermediate value, with values still held: they leave with the trial (a warm
# started trial leaves with os._exit, which runs no atexit handler).
ENDS_HOLDING = """
import tuner
for step in range(20):
    tuner.report(step / 10, step=step)
"""


def test_values_held_at_the_trials_end_reach_the_tuner(sqlite_home: Home, tmp_path: Path) -> None:
    spec = write_sweep(tmp_path / "code", ENDS_HOLDING, trials=2, parallelism=2, pruner="none")
    proc = sqlite_home.cli("sweep", "run", str(spec), "--wait", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = parse_json(proc.stdout)
    assert out["state"] == "completed", out
    for trial in out["trials_detail"]:
        assert trial["intermediate_values"] == [
            {"step": s, "value": s / 10} for s in range(20)], trial
        assert trial["value"] == 1.9
