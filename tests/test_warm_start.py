"""Warm starts: trials fork from a process that already imported their heavy modules, yet each
trial is a process of its own, so crashes, leaked state and random seeds never carry over. A
function sent from a notebook starts warm with the modules its pickle names preloaded."""

from __future__ import annotations

import asyncio
import gc
import io
import json
import os
import pickletools
from pathlib import Path

import cloudpickle
import numpy
import yaml

from tests.conftest import Home
from tests.sweeps_helpers import parse_json, record_dir, write_sweep
from tuner.backends import TrialEvent, TrialLaunch
from tuner.backends.local import LocalBackend
from tuner.backends.local.pickled_imports import pickled_imports
from tuner.backends.local.warm import preload_for
from tuner.sdk.run_function import COMMAND, FUNCTION_FILE
from tuner.spec import Resources

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
    record = record_dir(sqlite_home, tmp_path)
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
    assert "tuner.backends.local.zygote_process" in runs[0]["parent"]
    assert len({r["pid"] for r in runs.values()}) == 4, "each trial is its own process"
    assert all(r["leaked"] is None for r in runs.values()), "no state carried over"
    assert len({r["random"] for r in runs.values()}) == 4, "random state reseeded per trial"
    assert all(r["argv"] == ["train.py"] for r in runs.values())
    assert all(Path(r["cwd"]).name == str(n) for n, r in runs.items())


def test_cold_start_when_disabled(sqlite_home: Home, tmp_path: Path) -> None:
    record = record_dir(sqlite_home, tmp_path)
    sqlite_home.extra_env["TUNEHUB_WARM_START"] = "0"
    spec = write_sweep(
        tmp_path / "code", PROBE, trials=2, parallelism=1, sampler="grid",
        space={"x": {"type": "categorical", "choices": [0.2, 0.3]}},
    )
    sqlite_home.cli("sweep", "run", str(spec), "--wait", check=True)
    runs = [json.loads(p.read_text()) for p in record.iterdir()]
    assert len({r["ppid"] for r in runs}) == 1
    assert all("zygote" not in r["parent"] and "tunehub" in r["parent"] for r in runs)


# A notebook cell: numpy imported at the top and used by the function (cloudpickle stores it as
# a module to import), jinja2 imported in the function's body (stand-ins for TensorFlow: neither
# is imported by the warm-start process on its own). The function records whether jinja2 was
# there before its body imported it: only if the process the trial forked from preloaded it.
# numpy (imported when the pickle loads) is checked by the trial's own measure of what it
# imported after its fork: the sweep says "not fully warm" when anything installed was.
NOTEBOOK_CELL = """
import numpy as np

def objective(params):
    import json, os, pathlib, sys
    preloaded = {"jinja2": "jinja2" in sys.modules}
    import jinja2
    pathlib.Path(os.environ["RECORD_DIR"], os.environ["TUNEHUB_TRIAL_NUMBER"]).write_text(
        json.dumps(preloaded))
    return float(np.cos(params["x"]))
"""


def _notebook_function(code: Path) -> None:
    """``objective.pkl`` as ``tuner.Sweep.submit(function=...)`` ships it: defined in a
    notebook (a module nobody can import), so cloudpickle stores it by value."""
    cell: dict[str, object] = {"__name__": "notebook_cell"}
    exec(NOTEBOOK_CELL, cell)  # noqa: S102 -- the test's own source, as a notebook runs a cell
    code.mkdir(parents=True)
    (code / FUNCTION_FILE).write_bytes(cloudpickle.dumps(cell["objective"]))


def test_reading_a_pickle_names_its_modules_and_runs_none_of_it(tmp_path: Path) -> None:
    _notebook_function(tmp_path / "code")
    found = pickled_imports(tmp_path / "code" / FUNCTION_FILE)
    assert {"numpy", "jinja2"} <= found and not found & {"cloudpickle", "builtins"}, found
    # (os.system("touch ran"), not_installed_anywhere.models.Thing()), written by hand.
    evil = tmp_path / "evil.pkl"
    evil.write_bytes(b"(cos\nsystem\n(S'touch %s'\ntRcnot_installed_anywhere.models\nThing\n)Rt."
                     % str(tmp_path / "ran").encode())
    pickletools.dis(evil.read_bytes(), out=io.StringIO())  # a well-formed pickle
    found = pickled_imports(evil)
    assert "not_installed_anywhere" in found, found  # named, never imported
    assert not (tmp_path / "ran").exists(), "reading the pickle ran its code"
    (tmp_path / "by_ref.pkl").write_bytes(cloudpickle.dumps(numpy.mean))
    assert pickled_imports(tmp_path / "by_ref.pkl") == {"numpy"}
    assert pickled_imports(tmp_path / "absent.pkl") == frozenset()


def test_a_function_sweep_preloads_the_modules_its_function_uses(
    sqlite_home: Home, tmp_path: Path
) -> None:
    record = record_dir(sqlite_home, tmp_path)
    code = tmp_path / "code"
    _notebook_function(code)
    assert {"numpy", "jinja2"} <= pickled_imports(code / FUNCTION_FILE)
    spec = code / "sweep.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "fn", "command": COMMAND, "metric": "score", "trials": 2, "parallelism": 1,
        "sampler": "grid", "space": {"x": {"type": "categorical", "choices": [0.2, 0.3]}},
    }))
    out = parse_json(sqlite_home.cli("sweep", "run", str(spec), "--wait", "--json",
                                     check=True).stdout)
    assert out["state"] == "completed" and out["cold_start"] is None, out
    runs = [json.loads(p.read_text()) for p in record.iterdir()]
    log = sqlite_home.cli("sweep", "logs", str(out["id"]), "0", check=True).stdout
    assert runs == [{"jinja2": True}] * 2, (runs, log)
    assert ("warm start (forked from a process that imported tuner, cloudpickle, jinja2, numpy)"
            in log), log
    assert "not fully warm" not in log, log  # numpy and cloudpickle were preloaded too


def test_preload_reads_only_the_snapshot_owners_files(tmp_path: Path) -> None:
    """As root, the tuner reads a person's snapshot to choose what to preload. A file there
    that ends (through links the person may plant) at someone else's file is not read: the
    module names in it would reach the warm process their trial forks from."""
    code = tmp_path / "code"
    _notebook_function(code)
    elsewhere = tmp_path / "someone_elses.py"
    elsewhere.write_text("import tensorflow\nimport model\n")
    (code / "model.py").write_text("import keras\n")
    (code / "train.py").symlink_to(elsewhere)  # the owner's link to a file it cannot read
    os.mkfifo(code / "fifo.py")
    me, stranger = os.geteuid(), os.geteuid() + 4242  # the file's owner, and another user
    function = COMMAND.split()[1:]  # the warm argv: without the interpreter
    assert {"tensorflow", "keras"} <= set(preload_for(code, ["train.py"], "auto", me))
    assert not {"tensorflow", "keras"} & set(preload_for(code, ["train.py"], "auto", stranger))
    assert {"numpy", "jinja2"} <= set(preload_for(code, function, "auto", me))
    assert not {"numpy", "jinja2"} & set(preload_for(code, function, "auto", stranger))
    # A FIFO named like a module is skipped at once, never waited on.
    assert preload_for(code, ["fifo.py"], "auto", me) == preload_for(code, [], "none", me)


async def test_trials_launched_together_fork_from_one_warm_process(tmp_path: Path) -> None:
    """Several sweeps' first trials launched at once share one warm process. Each once started
    its own and only the last was kept: the others, referenced by nothing but their running
    trials, were garbage-collected, and those trials died with them (SIGKILL)."""
    backend = LocalBackend(tmp_path / "locks", gpu_ids=[], warm=True)
    events: asyncio.Queue[TrialEvent] = asyncio.Queue()
    backend.subscribe(events.put)
    launches = [TrialLaunch(
        sweep_id=n, trial_id=n, number=0, attempt=1, command="python train.py",
        workdir=tmp_path / f"w{n}", env={}, resources=Resources(), timeout=60,
        log_path=tmp_path / f"w{n}" / "trial.log", preload=(),
    ) for n in (1, 2, 3)]
    for launch in launches:
        launch.workdir.mkdir()
        (launch.workdir / "train.py").write_text(
            "import os, time\nprint(os.getppid(), flush=True)\ntime.sleep(1)\n")
    await asyncio.gather(*(backend.launch(launch) for launch in launches))
    gc.collect()  # what an orphaned warm process would not survive
    seen = [await asyncio.wait_for(events.get(), 60) for _ in range(2 * len(launches))]
    await backend.close()
    assert [e.kind for e in seen if e.final] == ["succeeded"] * len(launches), seen
    parents = {launch.log_path.read_text().splitlines()[-1] for launch in launches}
    assert len(parents) == 1, parents
