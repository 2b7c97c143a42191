"""Smoke test of the benchmark runner: ``python -m benchmarks --quick`` on the cheapest
benchmark really runs tunehub's controller and plain Optuna and writes both result files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_quick_scale_writes_results(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "scale", "--out", str(tmp_path),
         "--set", "scale_trials=30", "--set", "scale_databases=1"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    store = json.loads((tmp_path / "results.json").read_text())
    entry = store["benchmarks"]["scale"]
    assert "error" not in entry
    sqlite = entry["result"]["databases"]["sqlite"]
    assert sqlite["tunehub"]["state"] == "completed"
    assert sqlite["tunehub"]["per_trial_s"]["all"]["n"] == 30
    assert sqlite["optuna"]["ask_s"]["all"]["n"] == 30
    report = (tmp_path / "RESULTS.md").read_text()
    assert "## Scale of the controller" in report
    assert "| sqlite | tunehub per trial" in report
    assert entry["machine"]["logical_cpus"] >= 1 and entry["versions"]["optuna"]


def test_bad_size_option_is_one_line_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "scale", "--out", str(tmp_path),
         "--set", "scale_trials=lots"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert "--set expects KEY=N" in proc.stderr
    assert not (tmp_path / "results.json").exists()


def test_quick_resume_after_sigkill_counts_exactly(tmp_path: Path) -> None:
    """The resume benchmark's promise at smoke-test size: its sweep process really gets
    SIGKILL mid-sweep and a new process finishes it with exactly ``trials`` trials."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "resume", "--out", str(tmp_path),
         "--set", "resume_trials=100", "--set", "resume_kill_at=30",
         "--set", "resume_databases=1"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    entry = json.loads((tmp_path / "results.json").read_text())["benchmarks"]["resume"]
    assert "error" not in entry, entry.get("error")
    sqlite = entry["result"]["databases"]["sqlite"]
    killed = sqlite["at_kill"]
    assert 30 <= killed["rows"] < 100 and killed["sweep_state"] == "running"
    assert sqlite["after"]["rows"] == sqlite["after"]["distinct_numbers"] == 100
    assert sqlite["completed_results_lost"] == 0 and sqlite["exact"] is True
