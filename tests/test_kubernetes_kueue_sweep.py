"""A sweep on the Kubernetes backend whose trial Kueue evicts for a notebook, through the real
CLI and its controller, against the API emulator (kubesim's Kueue): the trial goes back to the
queue *preempted* (not failed, no retry used: ``max_retries: 0``), ``sweep show`` says where it
waits in the ClusterQueue, and it finishes from its checkpoint with the same number and
parameters."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from kubesim import KubeCluster
from tests.polling import wait_for
from tests.sweeps_helpers import kube_cli_home, parse_json, write_sweep
from tests.test_kubernetes_kueue import kueue_pool, notebook

pytestmark = pytest.mark.slow

# Checkpoints each step with the SDK until the gate opens; reports the step it resumed from.
TRAIN = """
import os, time, tuner
p = tuner.params()
found = tuner.restore()
start = found[1] if found else 0
step = start
while not os.path.exists(os.environ["GATE"]):
    step += 1
    tuner.checkpoint({"step": step, "x": p["x"]}, step)
    open(os.environ["PROGRESS"] + ".new", "w").write(str(step))
    os.replace(os.environ["PROGRESS"] + ".new", os.environ["PROGRESS"])  # whole if killed
    time.sleep(0.05)
tuner.report(float(start))
"""


def test_a_trial_kueue_evicts_resumes_as_preempted_and_sweep_show_says_why(
        kube: KubeCluster, tmp_path: Path) -> None:
    gate, progress = kube.data_dir / "gate", kube.data_dir / "progress"
    done = kube.data_dir / "notebook-done"
    home = kube_cli_home(
        kube, tmp_path, TUNEHUB_K8S_QUEUE="team", TUNEHUB_K8S_CLUSTER_QUEUE="team-a",
        TUNEHUB_K8S_WORKLOAD_PRIORITY_CLASSES=json.dumps(
            {p: f"wpc-{p}" for p in ("low", "normal", "high")}),
        TUNEHUB_K8S_GPU_TYPES=json.dumps([{"name": "a100", "product": "NVIDIA-A100-SXM4-80GB",
                                           "generation": 2, "maxPerNode": 2}]))
    kueue_pool(kube)
    spec = write_sweep(tmp_path / "code", TRAIN, trials=1, parallelism=1, max_retries=0,
                       pruner="none", direction="maximize", priority="low",
                       env={"GATE": str(gate), "PROGRESS": str(progress)},
                       resources={"cpu": 0.1, "memory": "256Mi", "gpu": 2, "gpu_type": "a100"})
    run = home.popen("sweep", "run", str(spec), "--backend", "kubernetes", "--wait", "--json")
    try:
        wait_for(lambda: progress.exists() and int(progress.read_text()) >= 3, 120,
                 "the trial to checkpoint a few steps")
        first = _trial(home)
        kube.create(notebook("jupyter-bob", done))  # both GPUs, notebook workload priority

        def waits_in_the_queue() -> dict | None:
            trial = _trial(home)
            reason = trial.get("reason") or ""
            return trial if trial.get("attempts") == 2 and "1st in queue" in reason else None

        waiting = wait_for(waits_in_the_queue, 120, "the preempted trial to wait in the queue")
        assert waiting["state"] == "running" and waiting["number"] == first["number"]
        assert waiting["params"] == first["params"] and waiting["preemptions"] == 1, waiting
        assert waiting["reason"] == (
            "waiting for quota in ClusterQueue team-a: 1st in queue (couldn't assign flavors "
            "to pod set main: insufficient quota for nvidia.com/gpu in flavor a100, 2 more "
            "needed)"), waiting
        text = home.cli("sweep", "show", "1", check=True).stdout
        assert "waiting for quota in ClusterQueue team-a: 1st in queue" in text, text
        saved = int(progress.read_text())
        gate.write_text("")
        done.write_text("")  # the notebook ends: the trial is admitted again
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0, out + err
    finally:
        if run.poll() is None:
            run.kill()
    sweep = parse_json(out)
    assert sweep["state"] == "completed" and sweep["failed"] == 0, sweep
    [trial] = sweep["trials_detail"]
    assert (trial["state"], trial["number"], trial["attempts"], trial["preemptions"]) == (
        "completed", first["number"], 2, 1), trial
    assert trial["params"] == first["params"]
    # It resumed from the checkpoint the evicted attempt saved, not from scratch.
    # (the checkpoint is written just before the progress file: it may be one step ahead)
    assert saved >= 3 and saved <= trial["value"] <= saved + 1, (trial, saved)


def _trial(home: object) -> dict:
    shown: subprocess.CompletedProcess[str] = home.cli("sweep", "show", "1", "--json")  # type: ignore[attr-defined]
    if shown.returncode != 0:
        return {}
    trials = parse_json(shown.stdout).get("trials_detail") or []
    return dict(trials[0]) if trials else {}
