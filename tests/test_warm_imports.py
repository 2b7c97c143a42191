"""Warm starts for whatever a trial imports: the import graph of its code decides what the warm
process preloads (installed packages only, never the person's own code), and a trial that
still imports a package after its fork is reported as not fully warm, naming it.

Real trials through the real local backend and its warm process, and through the CLI on
SQLite for what the sweep shows.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import textwrap
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from tests.conftest import Home
from tests.sweeps_helpers import parse_json, write_sweep
from tuner.backends import TrialEvent, TrialLaunch
from tuner.backends.local import LocalBackend
from tuner.backends.local.import_clock import MIN_SECONDS
from tuner.backends.local.installed import preloadable
from tuner.backends.local.warm import preload_for
from tuner.backends.local.zygote import Zygote, close_idle
from tuner.spec import Resources

# A scikit-learn trial whose script names nothing heavy: the model comes from a helper module.
# It records which modules were already there when it started (what it was forked with).
SKLEARN_TRAIN = """
import json, sys
there = {m: m in sys.modules for m in ("numpy", "sklearn", "sklearn.linear_model",
                                       "sklearn.datasets")}
from model import fit
print(json.dumps({"there": there, "score": fit()}), flush=True)
"""
SKLEARN_MODEL = """
from sklearn.datasets import load_digits
from sklearn.linear_model import SGDClassifier

def fit():
    x, y = load_digits(return_X_y=True)
    model = SGDClassifier(max_iter=5, tol=None, random_state=0).fit(x[:300], y[:300])
    return float(model.score(x[300:400], y[300:400]))
"""
METRICS = ("tunehub_trial_not_fully_warm_total", "tunehub_trial_import_after_start_seconds_total")
# A package no reading of the code can find: its name is computed when the trial runs (scipy's
# optimizers: a few hundred milliseconds of imports, nothing the warm process has loaded).
DYNAMIC_TRAIN = """
import importlib, os
module = importlib.import_module("".join(["sci", "py.optimize"]))
print(module.__name__, os.getpid(), flush=True)
"""


async def _run(tmp_path: Path, files: dict[str, str], preload: str | tuple[str, ...] = "auto",
               n: int = 1) -> tuple[list[TrialEvent], list[str]]:
    """Launch ``n`` warm trials of ``files`` (``train.py`` the entry) through the local
    backend; their final events and logs."""
    backend = LocalBackend(tmp_path / "locks", gpu_ids=[], warm=True)
    events: asyncio.Queue[TrialEvent] = asyncio.Queue()
    backend.subscribe(events.put)
    launches = []
    for i in range(n):
        workdir = tmp_path / f"w{i}"
        workdir.mkdir()
        for name, text in files.items():
            (workdir / name).write_text(textwrap.dedent(text))
        launches.append(TrialLaunch(
            sweep_id=1, trial_id=i + 1, number=i, attempt=1, command="python train.py",
            workdir=workdir, env={}, resources=Resources(), timeout=300,
            log_path=workdir / "trial.log", preload=preload))
    try:
        for launch in launches:
            await backend.launch(launch)
        seen = [await asyncio.wait_for(events.get(), 300) for _ in range(2 * n)]
    finally:
        await backend.close()
    assert all(e.kind == "started" and e.reason.startswith("warm start") for e in seen
               if not e.final), seen
    final = sorted((e for e in seen if e.final), key=lambda e: e.trial_id)
    return final, [launch.log_path.read_text() for launch in launches]


def test_the_import_graph_decides_what_is_preloaded(tmp_path: Path) -> None:
    code = tmp_path / "code"
    (code / "lib").mkdir(parents=True)
    (code / "train.py").write_text("import os, json\nfrom lib import model\nimport tuner\n")
    (code / "lib" / "__init__.py").write_text("")
    (code / "lib" / "model.py").write_text(
        "import numpy as np\nfrom sklearn.ensemble import RandomForestClassifier\n"
        "from sklearn import datasets\nimport not_installed_anywhere\nfrom . import util\n")
    (code / "lib" / "util.py").write_text("import jinja2.sandbox\n")
    (code / "unused.py").write_text("import scipy\n")
    found = preload_for(code, ["train.py"])
    # The modules themselves, not only their packages (sklearn's __init__ imports little);
    # no standard library, nothing of the snapshot, nothing not installed, nothing unused.
    assert found == ("tuner", "jinja2.sandbox", "numpy", "sklearn.datasets",
                     "sklearn.ensemble"), found
    assert preload_for(code, ["-m", "lib.model"])[0] == "tuner"
    assert preload_for(code, ["train.py"], "none") == ("tuner",)
    # A name made at import time (tensorflow.keras) or a class stands for its real module.
    assert preloadable(["tensorflow.keras", "sklearn.ensemble.RandomForestClassifier",
                        "sklearn", "os.path", "tuner.sdk"]) == ["sklearn.ensemble",
                                                                "tensorflow"]


async def test_a_sklearn_trial_starts_fully_warm(tmp_path: Path) -> None:
    (final,), (log,) = await _run(tmp_path, {"train.py": SKLEARN_TRAIN,
                                             "model.py": SKLEARN_MODEL})
    assert final.kind == "succeeded", (final, log)
    record = json.loads(next(line for line in log.splitlines() if line.startswith("{")))
    assert all(record["there"].values()), record  # preloaded before the trial ran a line
    assert final.imported_after_start == (), (final, log)  # measured: nothing paid after
    assert "sklearn.linear_model" in log.splitlines()[0], log  # the start note says so
    assert "not fully warm" not in log


async def test_a_package_imported_by_a_computed_name_is_reported(tmp_path: Path) -> None:
    before = {name: REGISTRY.get_sample_value(name) or 0.0 for name in METRICS}
    final, logs = await _run(tmp_path, {"train.py": DYNAMIC_TRAIN}, n=2)
    after = {name: REGISTRY.get_sample_value(name) or 0.0 for name in METRICS}
    assert after[METRICS[0]] - before[METRICS[0]] == 2, (before, after)
    assert after[METRICS[1]] - before[METRICS[1]] >= 2 * MIN_SECONDS, (before, after)
    for event, log in zip(final, logs, strict=True):
        assert event.kind == "succeeded", (event, log)
        assert event.imported_after_start is not None, log
        assert "scipy" in event.imported_after_start, event
        assert "=== tunehub: not fully warm: this trial spent " in log, log
        assert re.search(r"importing .*scipy \(\d+\.\d\d s\)", log), log


async def test_preloading_never_runs_the_persons_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module on the person's own path (here ``PYTHONPATH``) named in ``preload:`` is not
    imported by the warm process, which all of their trials share and which runs outside
    their cgroups: only the trial imports it, itself."""
    person = tmp_path / "persons_path"
    person.mkdir()
    marks = tmp_path / "imported-by"
    (person / "evilmod.py").write_text(
        f"import os\nwith open({str(marks)!r}, 'a') as f:\n    f.write(f'{{os.getpid()}}\\n')\n")
    monkeypatch.setenv("PYTHONPATH", str(person))
    train = "import os, evilmod\nprint('trial', os.getpid(), flush=True)\n"
    (final,), (log,) = await _run(tmp_path, {"train.py": train}, preload=("evilmod",))
    assert final.kind == "succeeded", (final, log)
    trial_pid = next(line.split()[1] for line in log.splitlines() if line.startswith("trial "))
    assert marks.read_text().split() == [trial_pid], "imported by the trial alone"
    assert final.imported_after_start == (), "the person's own module is no missed preload"


def test_a_sweep_that_pays_imports_after_the_fork_says_so(
    sqlite_home: Home, tmp_path: Path
) -> None:
    spec = write_sweep(tmp_path / "code", DYNAMIC_TRAIN + "import tuner\ntuner.report(1.0)\n",
                       trials=2, parallelism=1)
    out = parse_json(sqlite_home.cli("sweep", "run", str(spec), "--wait", "--json",
                                     check=True).stdout)
    assert out["state"] == "completed", out
    # Kept through the second trial's (warm) start: it paid the same import.
    note = out["cold_start"]
    assert note.startswith("not fully warm: trials imported ") and "scipy" in note, out
    shown = sqlite_home.cli("sweep", "show", str(out["id"]), check=True).stdout
    assert "note: not fully warm: trials imported " in shown, shown
    log = sqlite_home.cli("sweep", "logs", str(out["id"]), "1", check=True).stdout
    assert "not fully warm: this trial spent " in log, log


async def test_an_idle_warm_process_is_ended_and_a_busy_one_kept(tmp_path: Path) -> None:
    zygote = Zygote(())
    await zygote.start()
    zygotes = {"k": zygote}
    (tmp_path / "sleep.py").write_text("import time\ntime.sleep(120)\n")
    output = os.open(os.devnull, os.O_WRONLY)
    try:
        pid, exited = await zygote.spawn("t", ["sleep.py"], tmp_path, {}, output)
        await close_idle(zygotes, 0.0)
        assert zygotes == {"k": zygote} and zygote.alive, "a trial runs in it: kept"
        os.kill(pid, signal.SIGKILL)
        assert await asyncio.wait_for(exited, 60) == -signal.SIGKILL
        await close_idle(zygotes, 3600.0)
        assert zygotes == {"k": zygote}, "idle for less than the limit: kept"
        await close_idle(zygotes, 0.0)
        assert zygotes == {} and not zygote.alive, "idle: ended and forgotten"
    finally:
        os.close(output)
        await zygote.close()
