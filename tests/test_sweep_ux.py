"""A sweep that goes wrong says so at once; one that goes right wastes nothing.

Through the real CLI on SQLite (trials are real processes reporting over HTTP): warm starts
follow what the trial really imports and a cold start says why; a sweep whose trials keep failing
stops early with the failing trial's last lines; ``sweep logs ID`` picks the useful trial; piped
output keeps whole values; small sweeps keep their good trials.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import optuna
from prometheus_client import REGISTRY

from tests.conftest import Home
from tests.sweeps_helpers import parse_json, record_dir, write_sweep
from tuner.backends._base import TrialEvent, TrialLaunch
from tuner.backends.local import LocalBackend
from tuner.backends.local.imports import external_imports
from tuner.search.pruning import EnoughTrialsPruner
from tuner.spec import Resources, SweepSpec

# --- warm starts ------------------------------------------------------------------------------

HELPER_IMPORTS_TF = """
import sys, os, json, pathlib
preloaded = "tensorflow" in sys.modules  # before this script imports anything heavy
import tuner
from model import build  # model.py imports TensorFlow; this file never names it
pathlib.Path(os.environ["RECORD_DIR"], os.environ["TUNEHUB_TRIAL_NUMBER"]).write_text(
    json.dumps({"preloaded": preloaded}))
tuner.report(build(tuner.params()["x"]))
"""


def test_import_graph_follows_helper_modules(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "train.py").write_text("import os\nfrom pkg import nets\nfrom . import x\n")
    (tmp_path / "pkg" / "__init__.py").write_text("import numpy\n")
    (tmp_path / "pkg" / "nets.py").write_text("from .layers import dense\n")
    (tmp_path / "pkg" / "layers.py").write_text("import tensorflow.keras as k\n")
    (tmp_path / "unused.py").write_text("import torch\n")
    (tmp_path / "broken.py").write_text("def (\n")
    found = external_imports(tmp_path / "train.py", tmp_path)
    assert {"os", "numpy", "tensorflow"} <= found
    assert "torch" not in found, "a module the entry never imports does not count"
    assert "pkg" not in found, "the snapshot's own packages are not external"


def test_warm_start_when_tensorflow_comes_through_a_helper(
    sqlite_home: Home, tmp_path: Path
) -> None:
    record = record_dir(sqlite_home, tmp_path)
    code = tmp_path / "code"
    spec = write_sweep(code, HELPER_IMPORTS_TF, trials=2, parallelism=1, sampler="grid",
                       space={"x": {"type": "categorical", "choices": [0.2, 0.3]}})
    (code / "model.py").write_text("import tensorflow as tf\n\ndef build(x):\n    return x\n")
    out = parse_json(sqlite_home.cli("sweep", "run", str(spec), "--wait", "--json",
                                     check=True).stdout)
    runs = [json.loads(p.read_text()) for p in record.iterdir()]
    assert len(runs) == 2 and all(r["preloaded"] for r in runs), runs
    assert out["cold_start"] is None
    log = sqlite_home.cli("sweep", "logs", str(out["id"]), "0", check=True).stdout
    assert "warm start (forked from a process that imported tuner, tensorflow" in log


def test_cold_start_is_visible_with_its_reason(sqlite_home: Home, tmp_path: Path) -> None:
    spec = write_sweep(tmp_path / "code", "import tuner\ntuner.report(1.0)\n", trials=1,
                       parallelism=1, command="python -u train.py")
    out = parse_json(sqlite_home.cli("sweep", "run", str(spec), "--wait", "--json",
                                     check=True).stdout)
    assert out["cold_start"].startswith("cold start (the command 'python -u train.py'")
    shown = sqlite_home.cli("sweep", "show", str(out["id"]), check=True).stdout
    assert "note: cold start (the command 'python -u train.py'" in shown
    log = sqlite_home.cli("sweep", "logs", str(out["id"]), "0", check=True).stdout
    assert "=== tunehub: cold start (the command" in log


async def test_cold_starts_are_counted_in_a_metric(tmp_path: Path) -> None:
    before = REGISTRY.get_sample_value("tunehub_trial_starts_total", {"mode": "cold"}) or 0.0
    backend = LocalBackend(tmp_path / "locks", gpu_ids=[], warm=True)
    events: asyncio.Queue[TrialEvent] = asyncio.Queue()
    backend.subscribe(events.put)
    launch = TrialLaunch(
        sweep_id=1, trial_id=1, number=0, attempt=1, command="python -u -c pass",
        workdir=tmp_path / "w", env={}, resources=Resources(), timeout=60,
        log_path=tmp_path / "w" / "trial.log",
    )
    await backend.launch(launch)
    started = await asyncio.wait_for(events.get(), 30)
    finished = await asyncio.wait_for(events.get(), 30)
    await backend.close()
    assert started.kind == "started" and started.reason.startswith("cold start")
    assert finished.kind == "succeeded"
    after = REGISTRY.get_sample_value("tunehub_trial_starts_total", {"mode": "cold"})
    assert after == before + 1


# --- failing sweeps ----------------------------------------------------------------------------

BROKEN = """
import os, sys
print("loading data from", os.environ["DATA_PATH"])
"""


def test_a_sweep_whose_trials_keep_failing_stops_early_and_says_why(
    sqlite_home: Home, tmp_path: Path
) -> None:
    spec = write_sweep(tmp_path / "code", BROKEN, trials=40, parallelism=2,
                       env={"DATA_PTH": "/data"})
    proc = sqlite_home.cli("sweep", "run", str(spec), "--wait", "--json")
    assert proc.returncode == 1
    out = parse_json(proc.stdout)
    assert out["state"] == "failed"
    # Default limit: max(3, 10 % of 40) = 4 failed trials; the ones running then are stopped.
    assert out["failed"] == 4, out
    assert out["reason"].startswith("stopped after 4 failed trials (max_failed_trials: 4)")
    assert "KeyError: 'DATA_PATH'" in out["reason"], "the failing trial's last lines"
    states = [t["state"] for t in out["trials_detail"]]
    assert len(states) <= 4 + 2 + 1, "a few trials, not 40"
    assert set(states) <= {"failed", "cancelled"}
    assert all(t["reason"] == "sweep stopped" for t in out["trials_detail"]
               if t["state"] == "cancelled")
    shown = sqlite_home.cli("sweep", "show", str(out["id"]))
    assert "KeyError: 'DATA_PATH'" in shown.stdout

    # Without a trial number, logs shows the failed trial and says how to pick another.
    logs = sqlite_home.cli("sweep", "logs", str(out["id"]), check=True)
    assert "KeyError: 'DATA_PATH'" in logs.stdout
    assert re.search(r"trial \d+ of sweep \d+ \(the last failed trial", logs.stderr)
    assert f"tunehub sweep logs {out['id']} TRIAL" in logs.stderr


def test_max_failed_trials_zero_runs_every_trial_and_keeps_the_cause(
    sqlite_home: Home, tmp_path: Path
) -> None:
    spec = write_sweep(tmp_path / "code", BROKEN, trials=5, parallelism=2, max_failed_trials=0)
    out = parse_json(sqlite_home.cli("sweep", "run", str(spec), "--wait", "--json").stdout)
    assert out["failed"] == 5
    assert out["reason"].startswith("no trial completed; last failure, trial ")
    assert "KeyError: 'DATA_PATH'" in out["reason"]


# --- logs and piped output -----------------------------------------------------------------------

LONG_NAMES = """
import tuner
p = tuner.params()
tuner.report(0.123456 + p["a_rather_long_parameter_name"])
"""


def test_logs_default_to_the_best_trial_and_piped_tables_keep_whole_values(
    sqlite_home: Home, tmp_path: Path
) -> None:
    spec = write_sweep(
        tmp_path / "code", LONG_NAMES, trials=3, parallelism=1, sampler="grid",
        space={"a_rather_long_parameter_name": {"type": "categorical",
                                                "choices": [0.0001, 0.0002, 0.0003]},
               "another_parameter_with_a_long_name": {"type": "categorical",
                                                      "choices": ["some-long-choice-value"]}},
    )
    out = parse_json(sqlite_home.cli("sweep", "run", str(spec), "--wait", "--json",
                                     check=True).stdout)
    logs = sqlite_home.cli("sweep", "logs", str(out["id"]), check=True)
    assert f"trial {out['best_trial']} of sweep {out['id']} (the best trial)" in logs.stderr

    shown = sqlite_home.cli("sweep", "show", str(out["id"]), check=True).stdout  # a pipe
    assert "…" not in shown, shown
    for text in ("a_rather_long_parameter_name", "another_parameter_with_a_long_name",
                 "some-long-choice-value", "0.1238"):
        assert text in shown, (text, shown)


# --- pruning small sweeps ------------------------------------------------------------------


def _study(pruner: optuna.pruners.BasePruner) -> optuna.Study:
    return optuna.create_study(direction="maximize", pruner=pruner)


def _run(study: optuna.Study, values: list[float]) -> optuna.Trial:
    trial = study.ask()
    for step, value in enumerate(values, start=1):
        trial.report(value, step)
    return trial


def test_no_pruning_decision_until_enough_trials_reported_at_the_step() -> None:
    pruner = EnoughTrialsPruner(optuna.pruners.MedianPruner(n_startup_trials=1,
                                                           n_warmup_steps=0), min_trials=3)
    study = _study(pruner)
    for _ in range(2):
        done = _run(study, [0.9])
        study.tell(done, 0.9)
    weak = _run(study, [0.1])
    assert not weak.should_prune(), "two others at step 1 are not enough to judge"
    study.tell(weak, 0.1)
    weaker = _run(study, [0.05])
    assert weaker.should_prune(), "three others at step 1: the median rule applies"


def test_never_pruned_at_the_last_step() -> None:
    inner = optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0)
    study = _study(EnoughTrialsPruner(inner, min_trials=1, last_step=3))
    good = _run(study, [0.9, 0.9, 0.9])
    study.tell(good, 0.9)
    late = _run(study, [0.1, 0.1, 0.1])
    assert not late.should_prune(), "step 3 is the last: the trial has trained to the end"


def test_small_hyperband_sweep_keeps_its_trials(sqlite_home: Home, tmp_path: Path) -> None:
    script = """
import tuner
p = tuner.params()
for step in range(1, 6):
    tuner.report(p["x"] * step / 5, step=step, last=step == 5)
"""
    spec = write_sweep(
        tmp_path / "code", script, trials=6, parallelism=1, seed=3,
        pruner={"type": "hyperband", "min_resource": 1, "max_resource": 5,
                "reduction_factor": 3},
    )
    out = parse_json(sqlite_home.cli("sweep", "run", str(spec), "--wait", "--json",
                                     check=True).stdout)
    assert out["completed"] == 6 and out["pruned"] == 0, out["trials_detail"]
    assert SweepSpec.from_yaml(spec).pruner.type == "hyperband"


def test_new_spec_fields_name_what_is_wrong() -> None:
    base = {"name": "s", "command": "python t.py", "metric": "m",
            "space": {"x": {"type": "float", "low": 0, "high": 1}}}
    cases = [
        ({"preload": "tensorflow keras"}, "preload: expected auto, none or a list of module"),
        ({"preload": [1]}, "preload: expected auto, none or a list"),
        ({"max_failed_trials": -1}, "max_failed_trials: must be at least 0, got -1"),
        ({"max_failed_trials": "3"}, "max_failed_trials: expected an integer, got '3'"),
        ({"pruner": {"type": "median", "min_trials": 0}},
         "pruner.min_trials: expected an integer of at least 1, got 0"),
    ]
    for extra, expected in cases:
        try:
            SweepSpec.from_dict({**base, **extra})
        except ValueError as exc:
            assert str(exc).startswith(expected), (extra, str(exc))
        else:
            raise AssertionError(f"{extra} was accepted")
    spec = SweepSpec.from_dict({**base, "preload": ["tensorflow"], "max_failed_trials": 2,
                                "trials": 100})
    assert spec.preload == ("tensorflow",) and spec.failure_limit() == 2
    assert SweepSpec.from_dict(spec.to_dict()) == spec
    assert SweepSpec.from_dict({**base, "trials": 100}).failure_limit() == 10
    assert SweepSpec.from_dict({**base, "max_failed_trials": 0}).failure_limit() is None
