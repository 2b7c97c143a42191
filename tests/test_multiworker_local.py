"""Multi-worker trials on one machine: ``workers: 2`` starts two processes that form one
``MultiWorkerMirroredStrategy`` cluster over loopback TCP (ports tunehub picks) and report one
result; a worker that fails fails the attempt and its siblings are stopped."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from tests.conftest import Home
from tests.polling import wait_for
from tests.serving_helpers import served
from tests.sweeps_helpers import parse_json, write_sweep
from tunehub_base.process_identity import ProcessIdentity

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "digits_multiworker"


@pytest.mark.slow
def test_two_workers_train_one_keras_model_and_report_one_result(
    sqlite_home: Home, tmp_path: Path
) -> None:
    code = tmp_path / "code"
    shutil.copytree(EXAMPLE, code)
    spec = yaml.safe_load((code / "sweep.yaml").read_text())
    spec.update(trials=1, space={"lr": {"type": "categorical", "choices": [0.01]}})
    (code / "sweep.yaml").write_text(yaml.safe_dump(spec))
    sqlite_home.extra_env["DIGITS_EPOCHS"] = "2"
    out = parse_json(sqlite_home.cli(
        "sweep", "run", str(code / "sweep.yaml"), "--wait", "--json", timeout=600).stdout)
    assert out["state"] == "completed", out
    trials = out["trials_detail"]
    assert [t["state"] for t in trials] == ["completed"], trials
    # One result: the chief's two epoch reports, not four.
    assert [r["step"] for r in trials[0]["intermediate_values"]] == [1, 2], trials[0]
    log = sqlite_home.cli("sweep", "logs", str(out["id"]), "0", check=True).stdout
    chief, _, worker = log.partition("--- worker 1 ---")
    # Both processes were replicas of one cluster of two and ended with the same weights:
    # the validation accuracy (summed over both workers' shards) is the same on each.
    got = [re.search(r"replicas=(\d) val_accuracy=([\d.]+) chief=(\w+)", part)
           for part in (chief, worker)]
    assert all(got), log
    assert [(m[1], m[3]) for m in got] == [("2", "True"), ("2", "False")], log
    assert got[0][2] == got[1][2]
    assert float(got[0][2]) == pytest.approx(trials[0]["value"], abs=1e-4)
    # The chief's export is the registered model; the other worker kept nothing.
    model = parse_json(sqlite_home.cli("model", "show", "digits-mw", "--json",
                                       check=True).stdout)
    assert (Path(model[0]["path"]) / "saved_model.pb").is_file()
    # The sweep's policy promoted it, and TensorFlow Serving's config followed.
    config = Path(model[0]["path"]).parents[1] / "models.config"
    assert served(config)["digits-mw"]["labels"] == {"stable": model[0]["version"]}


WORKER_FAILS = """
import json, os, pathlib, sys, time
from tunehub_base.process_identity import ProcessIdentity
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
pathlib.Path(os.environ["RECORD_DIR"], f"{index}.pid").write_text(ProcessIdentity.current().line())
if index == 1:
    while not pathlib.Path(os.environ["RECORD_DIR"], "0.pid").exists():
        time.sleep(0.05)  # fail once the chief runs (then it must be stopped)
    sys.exit(3)
time.sleep(600)  # the chief would wait forever for its peer
"""


def test_a_failing_worker_fails_the_attempt_and_stops_the_others(
    sqlite_home: Home, tmp_path: Path
) -> None:
    out, record = run_recorded(sqlite_home, tmp_path, WORKER_FAILS, resources={"workers": 2},
                               max_retries=0, trial_timeout="20m")
    trials = out["trials_detail"]
    assert trials[0]["state"] == "failed", trials
    assert "worker 1 exited with code 3" in trials[0]["reason"], trials[0]
    chief = ProcessIdentity.parse((record / "0.pid").read_text())
    assert chief.start is not None, chief  # judged by its start time, never the pid alone
    wait_for(lambda: chief.alive() is False, timeout=30, what="the chief to be stopped")


TF_CONFIGS = """
import json, os, pathlib, tuner
cfg = json.loads(os.environ["TF_CONFIG"])
pathlib.Path(os.environ["RECORD_DIR"], f"{cfg['task']['index']}.json").write_text(
    json.dumps({"cfg": cfg, "chief": tuner.is_chief()}))
tuner.report(1.0)
"""


@pytest.mark.parametrize("warm", ["1", "0"])
def test_workers_get_one_cluster_of_distinct_loopback_ports(
    sqlite_home: Home, tmp_path: Path, warm: str
) -> None:
    sqlite_home.extra_env["TUNEHUB_WARM_START"] = warm  # forked from the zygote, or cold
    out, record = run_recorded(sqlite_home, tmp_path, TF_CONFIGS, resources={"workers": 3})
    assert out["state"] == "completed", out
    seen = [json.loads((record / f"{i}.json").read_text()) for i in range(3)]
    hosts = seen[0]["cfg"]["cluster"]["worker"]
    assert len(set(hosts)) == 3 and all(h.startswith("127.0.0.1:") for h in hosts)
    assert [s["cfg"]["cluster"]["worker"] for s in seen] == [hosts] * 3
    assert [s["cfg"]["task"] for s in seen] == [{"type": "worker", "index": i}
                                                for i in range(3)]
    assert [s["chief"] for s in seen] == [True, False, False]


def run_recorded(home: Home, tmp_path: Path, script: str, **spec: object) -> tuple[dict, Path]:
    """Run a one-trial sweep of ``script``, which writes into ``$RECORD_DIR``."""
    record = tmp_path / "record"
    record.mkdir(exist_ok=True)
    home.extra_env["RECORD_DIR"] = str(record)
    path = write_sweep(tmp_path / "code", script, trials=1, parallelism=1, **spec)
    return parse_json(home.cli("sweep", "run", str(path), "--wait", "--json").stdout), record


GPUS = """
import json, os, pathlib, tuner
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
gpus = os.environ["CUDA_VISIBLE_DEVICES"]
pathlib.Path(os.environ["RECORD_DIR"], f"{index}.gpu").write_text(gpus)
tuner.report(1.0)
"""


def test_each_worker_gets_its_own_gpus_and_too_many_are_refused(
    sqlite_home: Home, tmp_path: Path
) -> None:
    sqlite_home.extra_env["TUNEHUB_LOCAL_GPUS"] = "0,1"
    out, record = run_recorded(sqlite_home, tmp_path, GPUS, resources={"workers": 2, "gpu": 1})
    assert out["state"] == "completed", out
    assert sorted((record / f"{i}.gpu").read_text() for i in range(2)) == ["0", "1"]
    too_many = write_sweep(tmp_path / "code2", GPUS, trials=1, resources={"workers": 3, "gpu": 1})
    refused = sqlite_home.cli("sweep", "run", str(too_many), "--wait")
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "resources.gpu" in refused.stderr and "3 workers" in refused.stderr, refused.stderr
