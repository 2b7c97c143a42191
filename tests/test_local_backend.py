"""The local backend: whole GPUs per trial, never shared, never silently replaced by CPU."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import Home
from tests.sweeps_helpers import parse_json, write_sweep

RECORD = """
import json, os, time, pathlib, tuner
start = time.time()
time.sleep(0.4)  # hold the GPU for a while so trials overlap
out = pathlib.Path(os.environ["RECORD_DIR"]) / (os.environ["TUNEHUB_TRIAL_NUMBER"] + ".json")
out.write_text(json.dumps({"gpus": os.environ["CUDA_VISIBLE_DEVICES"], "start": start,
                           "end": time.time()}))
tuner.report(1.0)
"""


def test_trials_get_disjoint_whole_gpus(sqlite_home: Home, tmp_path: Path) -> None:
    record = tmp_path / "record"
    record.mkdir()
    sqlite_home.extra_env.update({"TUNEHUB_LOCAL_GPUS": "0,1,2", "RECORD_DIR": str(record)})
    spec = write_sweep(
        tmp_path / "code", RECORD, trials=6, parallelism=3, resources={"gpu": 1}
    )
    out = parse_json(sqlite_home.cli("sweep", "run", str(spec), "--wait", "--json").stdout)
    assert out["state"] == "completed", out
    runs = [json.loads(p.read_text()) for p in record.glob("*.json")]
    assert len(runs) == 6
    for run in runs:
        assert run["gpus"] in {"0", "1", "2"}
    overlapping = 0
    for i, a in enumerate(runs):
        for b in runs[i + 1 :]:
            if a["start"] < b["end"] and b["start"] < a["end"]:
                overlapping += 1
                assert a["gpus"] != b["gpus"], (a, b)
    assert overlapping > 0, "parallel trials should have overlapped"
    # Each attempt's GPU time is in the ledger, under its sweep and its owner.
    usage = parse_json(sqlite_home.cli("usage", "--since", "2026-01-01", "--json").stdout)
    assert set(usage["sweep"]) == {str(out["id"])} and usage["sweep"][str(out["id"])] > 0
    assert list(usage["person"]) == [out["owner"]]
    assert usage["gpu_hours"] >= sum(r["end"] - r["start"] for r in runs) / 3600


def test_two_gpu_trials_with_three_gpus_run_one_at_a_time(
    sqlite_home: Home, tmp_path: Path
) -> None:
    record = tmp_path / "record"
    record.mkdir()
    sqlite_home.extra_env.update({"TUNEHUB_LOCAL_GPUS": "0,1,2", "RECORD_DIR": str(record)})
    spec = write_sweep(
        tmp_path / "code", RECORD, trials=3, parallelism=3, resources={"gpu": 2}
    )
    out = parse_json(sqlite_home.cli("sweep", "run", str(spec), "--wait", "--json").stdout)
    assert out["state"] == "completed"
    runs = sorted((json.loads(p.read_text()) for p in record.glob("*.json")),
                  key=lambda r: r["start"])
    assert all(len(r["gpus"].split(",")) == 2 for r in runs)
    for a, b in zip(runs, runs[1:], strict=False):
        assert b["start"] >= a["end"] - 0.05, "a second 2-GPU trial cannot fit beside the first"


def test_gpu_request_beyond_the_machine_is_refused(sqlite_home: Home, tmp_path: Path) -> None:
    spec = write_sweep(tmp_path / "code", RECORD, resources={"gpu": 1})
    proc = sqlite_home.cli("sweep", "run", str(spec), "--wait")
    assert proc.returncode == 2
    assert proc.stderr.startswith("tunehub: error: resources.gpu: 1 GPU(s) per trial requested")
    assert "not run on the CPU" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    # Nothing was stored.
    assert sqlite_home.cli("sweep", "list", "--json").stdout.strip() == "[]"


def test_cpu_trials_see_no_gpu(sqlite_home: Home, tmp_path: Path) -> None:
    record = tmp_path / "record"
    record.mkdir()
    sqlite_home.extra_env.update({"TUNEHUB_LOCAL_GPUS": "0,1", "RECORD_DIR": str(record)})
    spec = write_sweep(tmp_path / "code", RECORD, trials=1, parallelism=1)
    sqlite_home.cli("sweep", "run", str(spec), "--wait", check=True)
    (run,) = [json.loads(p.read_text()) for p in record.glob("*.json")]
    assert run["gpus"] == ""
