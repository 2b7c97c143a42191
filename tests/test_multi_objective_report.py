"""A multi-objective sweep end to end without TensorFlow: trials report every metric as their
final result (``tuner.report({...})``), bad reports get a 400 naming the field, intermediate
values are kept but never judged, and Optuna's study holds every objective (issue 27)."""

from __future__ import annotations

import json
from pathlib import Path

import optuna

from tests.conftest import Home
from tests.sweeps_helpers import TRIAL_POST, parse_json, write_sweep

PROBE = TRIAL_POST + """
import pathlib, tuner

x = tuner.params()["x"]
results = {
    "not_a_mapping": post({"metrics": "high"}),
    "not_a_number": post({"metrics": {"score": "high", "cost": 1}}),
    "missing_objective": post({"metrics": {"score": x}}),
    "serving_figure": post({"metrics": {"score": x, "cost": 1, "model_size_mb": 1}}),
    "with_step": post({"metrics": {"score": x, "cost": 1}, "step": 2}),
    "intermediate": post({"value": x / 2, "step": 1}),
}
pathlib.Path(os.environ["RECORD"]).mkdir(exist_ok=True)
(pathlib.Path(os.environ["RECORD"]) / f"{os.environ['TUNEHUB_TRIAL_ID']}.json").write_text(
    json.dumps(results))
tuner.report({"score": x, "cost": (1 - x) ** 2, "extra": 7})
"""


def test_a_multi_objective_sweep_reports_every_metric(sqlite_home: Home, tmp_path: Path) -> None:
    record = tmp_path / "record"
    sqlite_home.extra_env["RECORD"] = str(record)
    spec = write_sweep(
        tmp_path / "code", PROBE, trials=3, parallelism=1, sampler="tpe", seed=1,
        metric="score", metrics=[{"name": "score"}, {"name": "cost", "direction": "minimize"}],
    )
    proc = sqlite_home.cli("sweep", "run", str(spec), "--wait", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = parse_json(proc.stdout)
    assert out["state"] == "completed" and out["completed"] == 3, out
    for path in record.iterdir():
        results = json.loads(path.read_text())
        assert results["not_a_mapping"][0] == 400
        assert results["not_a_mapping"][1]["field"] == "metrics"
        assert results["not_a_number"][0] == 400
        assert results["not_a_number"][1]["field"] == "metrics.score"
        assert results["missing_objective"][0] == 400
        assert results["missing_objective"][1]["field"] == "metrics"
        assert "must include 'cost'" in results["missing_objective"][1]["error"]
        assert results["serving_figure"][0] == 400
        assert results["serving_figure"][1]["field"] == "metrics.model_size_mb"
        assert results["with_step"][0] == 400
        assert results["intermediate"] == [200, {"prune": False, "batch_seconds": 1.0}]
    trials = out["trials_detail"]
    for t in trials:
        x = t["params"]["x"]
        assert t["value"] == x
        assert t["metrics"] == {"score": x, "cost": (1 - x) ** 2, "extra": 7}
        assert t["intermediate_values"] == [{"step": 1, "value": x / 2}]
    assert out["best_value"] == max(t["value"] for t in trials)
    study = optuna.load_study(study_name=optuna.get_all_study_names(sqlite_home.db_url)[0],
                              storage=sqlite_home.db_url)
    assert len(study.directions) == 2
    assert sorted(tuple(t.values) for t in study.trials) == sorted(
        (t["params"]["x"], (1 - t["params"]["x"]) ** 2) for t in trials)
    assert {t.number for t in study.best_trials}  # Optuna's own Pareto front over them
