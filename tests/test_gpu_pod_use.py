"""Kubernetes trial pods measure their own GPUs (issue #26): through the real CLI, against the
API emulator and its kubelet stand-in (pods are local processes), with the NVML stand-in loaded
in the pod as the real ``nvidia-ml-py`` loads a driver. The pod's reporter
(:mod:`tuner.sdk.gpu_report`) reads every GPU NVML shows it and posts the readings with the
trial's token; the tuner sums them and ``sweep show`` flags a trial that asked for a GPU and
never used it (its log says so at its end), and counts the use of one that did. Bad readings
are 400s naming the field, a token of no running attempt is refused (asked from inside a
pod)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kubesim import KubeCluster
from tests import test_gpu_usage
from tests.conftest import REPO
from tests.nvml_standin import GiB, StandIn
from tests.sweeps_helpers import kube_cli_home, parse_json, run_on_kubernetes
from tunehub_base.gpu_usage import GpuReading

pytestmark = [pytest.mark.slow]

nvml_library, standin = test_gpu_usage.nvml_library, test_gpu_usage.standin

TRAIN = """
import json, os, pathlib, time, tuner
from tuner.sdk.training import _post

p = tuner.params()
if os.environ.get("RECORD"):  # what the endpoint answers to bad readings and a wrong token
    me = os.environ["TUNEHUB_TRIAL_ID"]
    good = {"gpu": "0", "utilization": 0.5}
    answers = {}
    for name, body, token in (
            ("bad_reading", {"readings": [{"gpu": "0", "utilization": 7}]}, None),
            ("no_readings", {"readings": []}, None),
            ("wrong_token", {"readings": [good]}, "not-the-token")):
        if token:
            os.environ["TUNEHUB_TRIAL_TOKEN"], real = token, os.environ["TUNEHUB_TRIAL_TOKEN"]
        try:
            answers[name] = str(_post(f"trials/{me}/gpu-use", body))
        except RuntimeError as exc:
            answers[name] = str(exc)
        if token:
            os.environ["TUNEHUB_TRIAL_TOKEN"] = real
    pathlib.Path(os.environ["RECORD"]).write_text(json.dumps(answers))
time.sleep(4)  # the pod's GPU reporter reads its GPU meanwhile, every half second
tuner.report(p["x"])
"""


def gpu_sweep(tmp_path: Path, standin: StandIn, name: str,
              **env: str) -> dict[str, Any]:
    code = tmp_path / name
    code.mkdir()
    (code / "train.py").write_text(TRAIN)
    return {
        "name": name, "command": "python train.py", "metric": "score", "trials": 1,
        "parallelism": 1, "code": str(code), "pruner": "none",
        "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
        "resources": {"gpu": 1},
        # The pod loads the NVML stand-in; PYTHONPATH: this checkout's tuner in the pod (the
        # emulator's pods run the test venv's Python, whose tunehub may be another checkout).
        "env": {**standin.env, "PYTHONPATH": str(REPO), **env},
    }


def test_trial_pods_report_their_gpus_and_an_unused_one_is_flagged(
    kube: KubeCluster, standin: StandIn, tmp_path: Path
) -> None:
    home = kube_cli_home(
        kube, tmp_path, TUNEHUB_K8S_GPU_TYPES=json.dumps(
            [{"name": "t4", "product": "Tesla-T4", "generation": 1, "maxPerNode": 4}]),
        TUNEHUB_GPU_SAMPLE_SECONDS="0.5", TUNEHUB_GPU_IDLE_GRACE_SECONDS="1")
    standin.set({"util": 0, "mem_used": GiB, "mem_total": 16 * GiB})  # held, never used
    record = tmp_path / "record.json"
    idle = run_on_kubernetes(home, gpu_sweep(tmp_path, standin, "idle", RECORD=str(record)),
                             tmp_path)
    answers = json.loads(record.read_text())
    assert "(400)" in answers["bad_reading"] and "utilization" in answers["bad_reading"]
    assert "(400)" in answers["no_readings"] and "readings" in answers["no_readings"]
    assert "(401)" in answers["wrong_token"], answers
    use = idle["trials_detail"][0]["gpu_use"]
    assert use is not None and use["unused"] is True and use["unused_gpus"] == ["0"], use
    assert use["absent"] is None and use["measured_seconds"] >= 1, use
    shown = home.cli("sweep", "show", str(idle["id"]), check=True).stdout
    assert "unused" in shown and "did not use it" in shown, shown
    log = home.cli("sweep", "logs", str(idle["id"]), "0", check=True).stdout
    assert "tunehub: this attempt held GPU 0 for" in log and "never used it" in log, log

    standin.set({"util": 80, "mem_used": 4 * GiB, "mem_total": 16 * GiB})
    busy = run_on_kubernetes(home, gpu_sweep(tmp_path, standin, "busy"), tmp_path)
    use = busy["trials_detail"][0]["gpu_use"]
    assert use is not None and use["unused"] is False, use
    assert use["used_seconds"] > 0 and use["peak_memory_bytes"] == 4 * GiB, use
    again = parse_json(home.cli("sweep", "show", str(busy["id"]), "--json", check=True).stdout)
    assert again["trials_detail"][0]["gpu_use"]["unused"] is False
    assert "never used" not in home.cli("sweep", "logs", str(busy["id"]), "0", check=True).stdout


def test_a_reading_is_checked_field_by_field() -> None:
    good = GpuReading("0", utilization=0.5, memory_used_bytes=1, pids=(3,)).to_json()
    assert GpuReading.from_json(good).utilization == 0.5
    for bad, field in (({**good, "utilization": 2}, "utilization"),
                       ({**good, "pids": ["x"]}, "pids"), ({**good, "gpu": ""}, "gpu"),
                       ({**good, "memory_used_bytes": -1}, "memory_used_bytes"),
                       ({**good, "absent": "x" * 1000}, "absent"), ([], "reading")):
        with pytest.raises(ValueError, match=field):
            GpuReading.from_json(bad)
