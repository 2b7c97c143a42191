"""A ``workers: 2`` sweep on the Kubernetes backend, against the API emulator: the trial is an
Indexed Job of two pods behind a headless Service; each emulated pod has its own loopback
address and the Service's per-pod names resolve to them (kubesim.podnet), so the two pods
train one Keras model with MultiWorkerMirroredStrategy over TCP and the trial reports once."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from kubesim import KubeCluster
from tests.conftest import REPO
from tests.sweeps_helpers import kube_cli_home, parse_json, run_on_kubernetes

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "digits_multiworker"


def test_two_pods_train_one_model_over_the_pod_network(kube: KubeCluster, tmp_path: Path) -> None:
    home = kube_cli_home(kube, tmp_path)
    spec = yaml.safe_load((EXAMPLE / "sweep.yaml").read_text())
    spec.update(trials=1, code=str(EXAMPLE),
                space={"lr": {"type": "categorical", "choices": [0.01]}},
                # PYTHONPATH: the pods import this checkout's tuner, as the image would.
                env={"DIGITS_EPOCHS": "2", "TF_CPP_MIN_LOG_LEVEL": "2",
                     "PYTHONPATH": str(REPO)})
    sweep = run_on_kubernetes(home, spec, tmp_path)
    [trial] = sweep["trials_detail"]
    assert trial["state"] == "completed" and trial["attempts"] == 1, trial
    assert [r["step"] for r in trial["intermediate_values"]] == [1, 2], trial  # chief only
    creates = kube.counters.snapshot()
    assert creates[("create", "services")] == 1  # the headless Service of the workers

    log = home.cli("sweep", "logs", str(sweep["id"]), "0", check=True).stdout
    pods = re.split(r"^--- pod (\S+) ---$", log, flags=re.M)[1:]
    assert len(pods) == 4, log  # two pods' logs, each under its name
    lines = {}
    for name, text in zip(pods[::2], pods[1::2], strict=True):
        m = re.search(r"replicas=(\d) val_accuracy=([\d.]+) chief=(\w+) cluster=(\[.*?\])", text)
        assert m, text
        lines[name] = m
    by_chief = {m[3]: m for m in lines.values()}
    assert set(by_chief) == {"True", "False"}
    assert all(m[1] == "2" for m in lines.values())  # one cluster of two replicas
    assert by_chief["True"][2] == by_chief["False"][2]  # same weights on both
    assert float(by_chief["True"][2]) == pytest.approx(trial["value"], abs=1e-4)
    # The Service's per-pod names resolved to two pods' own addresses (not the host's).
    peers = json.loads(by_chief["True"][4])
    assert peers == json.loads(by_chief["False"][4])
    ips = [p.rsplit(":", 1)[0] for p in peers]
    assert len(set(ips)) == 2 and "127.0.0.1" not in ips and all(
        ip.startswith("127.") for ip in ips), peers

    versions = parse_json(home.cli("model", "show", "digits-mw", "--json", check=True).stdout)
    assert [v["stage"] for v in versions] == ["production"]

