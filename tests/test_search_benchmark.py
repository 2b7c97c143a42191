"""The search benchmark's accounting, and a smoke run of it: ``python -m benchmarks --quick
search`` really trains the workloads' models, drives tunehub's default sampler and pruner, random
search and plain Optuna, and writes the table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.search_sim import Trace
from benchmarks.search_workloads import WORKLOADS, train

REPO = Path(__file__).resolve().parent.parent


def test_summary_counts_compute_to_the_first_completed_hit_and_pruned_winners() -> None:
    trace = Trace()
    # Trial A: pruned after 1 epoch (t=1) but would have ended at 0.9; trial B completes at
    # t=3 with 0.8 after 3 epochs; trial C completes at t=6 with 0.95.
    trace.reports = [1.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    trace.ends = [(1.0, None, 0.9, 1), (3.0, 0.8, 0.8, 3), (6.0, 0.95, 0.95, 3)]
    out = trace.summary(target=0.85, budget=4)
    assert out["reached"] and out["epochs"] == 7 and out["seconds"] == 6.0
    assert out["pruned"] == 1 and out["pruned_winners"] == 1 and out["pruned_after_1"] == 1
    assert out["best_at_budget"] == 0.8  # by the 4th epoch only B had completed
    assert out["best"] == 0.95
    assert not trace.summary(target=0.99, budget=4)["reached"]


def test_training_is_deterministic_so_a_pruned_trial_can_be_finished_later() -> None:
    params = {"lr": 0.01, "layers": 2, "width": 16, "alpha": 1e-4, "batch_size": 128}
    first, _ = train(WORKLOADS["friedman"], params, 3)
    again, _ = train(WORKLOADS["friedman"], params, 3)
    assert first == again and len(first) == 3
    diverged, _ = train(WORKLOADS["clusters"], {**params, "lr": 1.0, "alpha": 1e-6}, 2)
    assert all(0.0 <= v <= 1.0 for v in diverged)  # a blown-up model scores the floor


def test_quick_search_benchmark_writes_the_table(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "search", "--out", str(tmp_path),
         "--set", "search_trials=3"],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    entry = json.loads((tmp_path / "results.json").read_text())["benchmarks"]["search"]
    assert "error" not in entry, entry.get("error")
    for name in ("clusters", "friedman"):
        methods = entry["result"]["workloads"][name]["methods"]
        assert set(methods) >= {"tunehub", "random", "optuna"}
        run = methods["random"]["runs"][0]
        assert run["total_epochs"] == 3 * 27 and run["completed"] == 3  # nothing pruned
    report = (tmp_path / "RESULTS.md").read_text()
    assert "## Search quality where the search matters" in report
    assert "| tunehub defaults |" in report
