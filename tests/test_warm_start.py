"""Warm starts: trials fork from a process that already imported their heavy modules, yet each
trial is a process of its own, so crashes, leaked state and random seeds never carry over."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import Home
from tests.sweeps_helpers import parse_json, write_sweep

PROBE = """
import json, os, random, sys, pathlib, tuner
import tensorflow as tf  # preloaded by the warm-start process
p = tuner.params()
leaked = getattr(json, "_tunehub_leak", None)
json._tunehub_leak = p["x"]  # module state a careless trial leaves behind
record = {
    "pid": os.getpid(), "ppid": os.getppid(), "leaked": leaked,
    "random": random.random(),
    "cwd": os.getcwd(), "argv": sys.argv,
    "parent": open(f"/proc/{os.getppid()}/cmdline", "rb").read().decode().replace("\\0", " "),
}
pathlib.Path(os.environ["RECORD_DIR"], os.environ["TUNEHUB_TRIAL_NUMBER"]).write_text(
    json.dumps(record))
if p["x"] == 0.1:
    os.abort()  # a crashing trial
tuner.report(p["x"])
"""


def test_warm_trials_are_isolated(sqlite_home: Home, tmp_path: Path) -> None:
    record = tmp_path / "record"
    record.mkdir()
    sqlite_home.extra_env["RECORD_DIR"] = str(record)
    spec = write_sweep(
        tmp_path / "code", PROBE, trials=4, parallelism=1, sampler="grid",
        space={"x": {"type": "categorical", "choices": [0.1, 0.2, 0.3, 0.4]}},
    )
    out = parse_json(sqlite_home.cli("sweep", "run", str(spec), "--wait", "--json").stdout)
    runs = {int(p.name): json.loads(p.read_text()) for p in record.iterdir()}
    assert len(runs) == 4
    states = {t["params"]["x"]: (t["state"], t["reason"]) for t in out["trials_detail"]}
    assert states[0.1] == ("failed", "killed by SIGABRT")
    assert all(states[x][0] == "completed" for x in (0.2, 0.3, 0.4))
    parents = {r["ppid"] for r in runs.values()}
    assert len(parents) == 1, "all trials fork from one warm process"
    assert "tuner.backends.zygote_process" in runs[0]["parent"]
    assert len({r["pid"] for r in runs.values()}) == 4, "each trial is its own process"
    assert all(r["leaked"] is None for r in runs.values()), "no state carried over"
    assert len({r["random"] for r in runs.values()}) == 4, "random state reseeded per trial"
    assert all(r["argv"] == ["train.py"] for r in runs.values())
    assert all(Path(r["cwd"]).name == str(n) for n, r in runs.items())


def test_cold_start_when_disabled(sqlite_home: Home, tmp_path: Path) -> None:
    record = tmp_path / "record"
    record.mkdir()
    sqlite_home.extra_env.update({"RECORD_DIR": str(record), "TUNEHUB_WARM_START": "0"})
    spec = write_sweep(
        tmp_path / "code", PROBE, trials=2, parallelism=1, sampler="grid",
        space={"x": {"type": "categorical", "choices": [0.2, 0.3]}},
    )
    sqlite_home.cli("sweep", "run", str(spec), "--wait", check=True)
    runs = [json.loads(p.read_text()) for p in record.iterdir()]
    assert len({r["ppid"] for r in runs}) == 1
    assert all("zygote" not in r["parent"] and "tunehub" in r["parent"] for r in runs)
