"""The engine through the real CLI, on SQLite and PostgreSQL: trials are real processes that
report over HTTP; results land in the database and in Optuna's study."""

from __future__ import annotations

from pathlib import Path

import optuna

from tests.conftest import Home
from tests.sweeps_helpers import parse_json, write_sweep

QUADRATIC = """
import tuner
p = tuner.params({"x": 0.5})
for step in range(1, 4):
    tuner.report(1 - (p["x"] - 0.3) ** 2 + 0.001 * step, step=step)
print("trained with", p)
"""


def test_sweep_runs_every_trial_and_records_results(home: Home, tmp_path: Path) -> None:
    spec = write_sweep(tmp_path / "code", QUADRATIC, trials=6, parallelism=3, seed=1)
    out = parse_json(home.cli("sweep", "run", str(spec), "--wait", "--json", check=True).stdout)
    assert out["state"] == "completed"
    trials = out["trials_detail"]
    assert sorted(t["number"] for t in trials) == list(range(6))
    assert all(t["state"] == "completed" for t in trials)
    for t in trials:
        expected = 1 - (t["params"]["x"] - 0.3) ** 2 + 0.003
        assert abs(t["value"] - expected) < 1e-9
        assert t["last_step"] == 3
    best = max(trials, key=lambda t: t["value"])
    assert out["best_trial"] == best["number"] and out["best_value"] == best["value"]

    # The study in the same database agrees.
    study = optuna.load_study(study_name=_study_name(home, out["id"]), storage=home.db_url)
    assert len(study.trials) == 6
    assert study.best_trial.number == best["number"]

    # Intermediate values, logs and listing.
    shown = parse_json(home.cli("sweep", "show", str(out["id"]), "--json", check=True).stdout)
    steps = [r["step"] for r in shown["trials_detail"][0]["intermediate_values"]]
    assert steps == [1, 2, 3]
    log = home.cli("sweep", "logs", str(out["id"]), "0", check=True).stdout
    assert "trained with" in log and "attempt 1" in log
    listed = parse_json(home.cli("sweep", "list", "--json", check=True).stdout)
    assert [s["id"] for s in listed] == [out["id"]]


def test_study_says_whose_sweep_it_is(home: Home, tmp_path: Path) -> None:
    """optuna-dashboard opened on our database lists studies by name and shows their user
    attributes: plain Optuna reads owner, sweep id and sweep name from each sweep's study."""
    home.extra_env["TUNEHUB_USER"] = "alice"
    ids = {}
    for name in ("digits-mlp", "digits-cnn"):
        spec = write_sweep(tmp_path / name, QUADRATIC, name=name, trials=1, parallelism=1)
        run = home.cli("sweep", "run", str(spec), "--wait", "--json", check=True)
        ids[name] = parse_json(run.stdout)["id"]
    studies = {s.study_name: s for s in optuna.get_all_study_summaries(home.db_url)}
    assert len(studies) == 2
    for name, sweep_id in ids.items():
        study = studies[_study_name(home, sweep_id)]
        assert study.user_attrs == {"owner": "alice", "sweep_id": sweep_id, "sweep_name": name}
        assert study.study_name.startswith(f"alice/{name}/")


def _study_name(home: Home, sweep_id: int) -> str:
    from tuner.db import Database, SweepRow

    db = Database(home.db_url)
    with db.session() as s:
        sweep = s.get(SweepRow, sweep_id)
        assert sweep is not None
        return sweep.study_name


def test_pruner_stops_bad_trials_and_trial_sees_pruned(home: Home, tmp_path: Path) -> None:
    # Trials with x > 0.5 are bad at every step; the median pruner stops them once enough
    # good trials exist. A pruned trial records the step where it was stopped.
    script = """
import pathlib, tuner
p = tuner.params()
try:
    for step in range(1, 11):
        tuner.report(1.0 if p["x"] < 0.5 else 0.0, step=step)
except tuner.Pruned:
    pathlib.Path("pruned-flag").write_text("yes")
    raise
"""
    spec = write_sweep(
        tmp_path / "code", script, trials=10, parallelism=1, sampler="grid",
        space={"x": {"type": "categorical", "choices": [0.1, 0.2, 0.3, 0.4, 0.6, 0.7, 0.8,
                                                         0.9, 0.15, 0.25]}},
        pruner={"type": "median", "n_startup_trials": 2, "n_warmup_steps": 0},
    )
    out = parse_json(home.cli("sweep", "run", str(spec), "--wait", "--json", check=True).stdout)
    by_state: dict[str, list[dict]] = {}
    for t in out["trials_detail"]:
        by_state.setdefault(t["state"], []).append(t)
    assert by_state.get("pruned"), out["trials_detail"]
    for t in by_state["pruned"]:
        assert t["params"]["x"] > 0.5
        assert t["last_step"] < 10
    assert all(t["params"]["x"] < 0.5 for t in by_state["completed"])
    assert out["pruned"] == len(by_state["pruned"])


def test_failed_attempts_are_retried_then_fail_with_a_reason(home: Home, tmp_path: Path) -> None:
    script = """
import os, sys, tuner
p = tuner.params()
attempt = int(os.environ["TUNEHUB_TRIAL_ATTEMPT"])
if p["x"] < 0.5 and attempt == 1:
    sys.exit("flaky first attempt")
if p["x"] >= 0.5:
    raise RuntimeError("always broken")
tuner.report(p["x"])
"""
    spec = write_sweep(
        tmp_path / "code", script, trials=4, parallelism=2, max_retries=1, sampler="grid",
        space={"x": {"type": "categorical", "choices": [0.1, 0.2, 0.7, 0.8]}},
    )
    proc = home.cli("sweep", "run", str(spec), "--wait", "--json")
    out = parse_json(proc.stdout)
    for t in out["trials_detail"]:
        assert t["attempts"] == 2, t
        if t["params"]["x"] < 0.5:
            assert t["state"] == "completed" and t["value"] == t["params"]["x"]
        else:
            assert t["state"] == "failed"
            assert "exited with code 1" in t["reason"]
    log = home.cli("sweep", "logs", str(out["id"]), "0").stdout
    assert "attempt 2 (after:" in log


def test_timeout_and_missing_report_fail_the_trial(sqlite_home: Home, tmp_path: Path) -> None:
    script = """
import time, tuner
p = tuner.params()
if p["x"] > 0.5:
    time.sleep(60)
"""
    spec = write_sweep(
        tmp_path / "code", script, trials=2, parallelism=2, sampler="grid", trial_timeout="2s",
        space={"x": {"type": "categorical", "choices": [0.1, 0.9]}},
    )
    proc = sqlite_home.cli("sweep", "run", str(spec), "--wait", "--json")
    assert proc.returncode == 1  # no trial completed
    out = parse_json(proc.stdout)
    assert out["state"] == "failed" and out["reason"].startswith("no trial completed; ")
    reasons = {t["params"]["x"]: t["reason"] for t in out["trials_detail"]}
    assert "timed out after 2s" in reasons[0.9]
    assert "without reporting score" in reasons[0.1]


def test_home_inside_the_code_directory_is_not_snapshotted(tmp_path: Path) -> None:
    """A project keeping its tunehub state in the project (TUNEHUB_HOME=./.tunehub): the code
    snapshot leaves the state out (copying the home into itself never ended)."""
    code = tmp_path / "project"
    home = Home(code / ".tunehub", f"sqlite:///{code / '.tunehub' / 'tunehub.sqlite'}")
    spec = write_sweep(code, "import tuner\ntuner.report(tuner.params()['x'])\n", trials=2)
    out = parse_json(home.cli("sweep", "run", str(spec), "--wait", "--json", check=True).stdout)
    assert out["completed"] == 2
    snapshot = code / ".tunehub" / "sweeps" / str(out["id"]) / "code"
    assert sorted(p.name for p in snapshot.iterdir()) == ["sweep.yaml", "train.py"]
