"""Writing small trial scripts and specs for engine tests."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import yaml

#: The smallest file the registry takes as ``saved_model.pb``: a ``SavedModel`` with one meta
#: graph whose graph has one node (``tuner.serving.intake`` refuses anything less). For tests
#: that register a model without TensorFlow; trial scripts embed it with ``repr``.
MINIMAL_SAVED_MODEL = b"\x08\x01\x12\x07\x12\x05\x0a\x03\x0a\x01x"


#: Trial code: ``post(body)`` sends ``body`` to the trial's own report route with its token and
#: returns (status, JSON answer), for trials that try what the SDK would not send.
TRIAL_POST = """
import json, os, urllib.request, urllib.error

def post(body):
    url = os.environ["TUNEHUB_API_URL"] + f"api/v1/trials/{os.environ['TUNEHUB_TRIAL_ID']}/report"
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
        "Authorization": f"Bearer {os.environ['TUNEHUB_TRIAL_TOKEN']}",
        "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
"""


def write_sweep(directory: Path, script: str, **spec: Any) -> Path:
    """A code directory with ``train.py`` and a ``sweep.yaml`` running it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "train.py").write_text(textwrap.dedent(script))
    data: dict[str, Any] = {
        "name": "t",
        "command": "python train.py",
        "metric": "score",
        "trials": 4,
        "parallelism": 2,
        # Tests of other features count every trial; the default pruner (README, "Search
        # defaults") is tested on its own.
        "pruner": "none",
        "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
    }
    data.update(spec)
    path = directory / "sweep.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def record_dir(home: Any, tmp_path: Path) -> Path:
    """A directory a test's trials write what they saw into (``RECORD_DIR`` in their
    environment): what a trial process itself observes, read back after the sweep."""
    record = tmp_path / "record"
    record.mkdir()
    home.extra_env["RECORD_DIR"] = str(record)
    return record


def parse_json(stdout: str) -> Any:
    return json.loads(stdout)


def run_on_kubernetes(home: Any, spec: dict[str, Any], directory: Path) -> dict[str, Any]:
    """``tunehub sweep run`` of ``spec`` (written to ``directory``) on the kubernetes backend,
    waited for; the sweep as ``--json`` prints it, which must have completed."""
    path = directory / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    run = home.cli("sweep", "run", str(path), "--backend", "kubernetes", "--wait", "--json",
                   timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    sweep = parse_json(run.stdout)
    assert sweep["state"] == "completed", sweep
    return sweep


def kube_cli_home(kube: Any, tmp_path: Path, **extra_env: str) -> Any:
    """A CLI home whose sweeps run on the emulated cluster ``kube`` (its data store as
    ``TUNEHUB_DATA``), with the sweep PriorityClasses the backend's defaults name, as the
    chart's tuner ServiceAccount (its Role) in a namespace enforcing Pod Security
    ``restricted``, as the chart installs it."""
    from tests.chart_security import install_chart_security, tuner_kubeconfig
    from tests.conftest import Home

    for value, priority in ((10, "low"), (100, "normal"), (500, "high")):
        kube.create({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                     "metadata": {"name": f"tunehub-sweep-{priority}"}, "value": value})
    install_chart_security(kube)
    data = kube.data_dir
    return Home(data / ".tunehub", f"sqlite:///{tmp_path / 'tunehub.sqlite'}", extra_env={
        "KUBECONFIG": str(tuner_kubeconfig(kube)), "TUNEHUB_DATA": str(data), **extra_env})
