"""The Kubernetes API misbehaves while a sweep runs on it: 503 and 429 answers (with
``Retry-After``), 500s, a create applied whose answer was lost, slow answers, watches that end
at once or answer 410 Gone. The backend retries, re-lists and resumes watching: every trial
runs once, in one Job, and the sweep completes as if nothing happened.

The faults are the emulator's (:mod:`kubesim.faults`), injected into the tuner's requests over
real HTTP; the sweep is the real CLI's on the kubernetes backend.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from kubesim import KubeCluster
from tests.fault_records import FaultRecord, record
from tests.polling import wait_for
from tests.sweeps_helpers import kube_cli_home, run_on_kubernetes, write_sweep

pytestmark = pytest.mark.slow

TRIALS = 4
TRAIN = """
import tuner
p = tuner.params()
tuner.report(p["x"], step=1)
tuner.report(p["x"])
"""


def test_api_faults_lose_and_duplicate_no_attempt(kube: KubeCluster, tmp_path: Path) -> None:
    home = kube_cli_home(kube, tmp_path)
    faults = kube.faults
    injected = [
        faults.inject(503, verb="create", resource="jobs", times=2, retry_after=1),
        faults.inject(500, verb="create", resource="jobs", applied=True),  # answer lost
        faults.inject(429, verb="create", resource="secrets", retry_after=1),
        faults.inject(500, verb="create", resource="secrets", applied=True),
        faults.inject(0, verb="list", resource="jobs", delay=2.0),  # a slow answer
        faults.inject(503, verb="list", resource="pods"),
        faults.inject(0, verb="watch", resource="jobs", times=3),  # ends at once
        faults.inject(410, verb="watch", resource="pods", times=2),  # Gone: list again
        faults.inject(500, verb="watch", resource="jobs"),
        faults.inject(503, verb="delete", resource="jobs", times=2),
    ]
    spec_path = write_sweep(tmp_path / "code", TRAIN, trials=TRIALS, parallelism=2,
                            max_retries=0, sampler="random",
                            resources={"cpu": 0.1, "memory": "256Mi"})
    spec = yaml.safe_load(spec_path.read_text())
    spec["code"] = str(spec_path.parent)
    began = time.monotonic()
    sweep = run_on_kubernetes(home, spec, tmp_path)
    took = time.monotonic() - began

    # Every fault struck (the test exercised what it says).
    assert [f.hits for f in injected] == [f.times for f in injected], injected
    trials = sweep["trials_detail"]
    assert sorted(t["number"] for t in trials) == list(range(TRIALS)), trials
    assert all(t["state"] == "completed" for t in trials), trials
    assert all(t["attempts"] == 1 for t in trials), trials  # no attempt failed or doubled
    assert sweep["completed"] == TRIALS, sweep
    # One Job per attempt: the lost answer's retry found its Job (409), made no second one
    # (a second Job of a trial would be a second attempt, or a Job left behind).
    assert kube.objects("jobs") == []  # cleaned up with the sweep
    record(FaultRecord(
        fault="Kubernetes API: 503/429/500, a lost create answer, slow list, watches ended "
              "and 410 Gone (10 rules, " + str(sum(f.hits for f in injected)) + " faults)",
        duration_s=round(took, 1), sweeps=1, trials=TRIALS, running=2, lost=0,
        recover_s=0.0,
        seen="nothing: the sweep completed, each trial one attempt; the CLI's log shows one "
             "warning per retried call"))


async def test_an_answer_too_slow_is_given_up_on_and_tried_again(
    kube: KubeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that takes the request and does not answer in time: the call gives up after
    ``REQUEST_SECONDS`` and tries again, instead of holding the backend (the slow request,
    carried out later, meets the object the retry made: a 409 nobody hears)."""
    from tuner.backends.kubernetes import KubeSettings
    from tuner.backends.kubernetes import api as kube_api

    monkeypatch.setattr(kube_api, "REQUEST_SECONDS", 1.0)
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig))
    settings = KubeSettings.from_env()
    client = kube_api.Kube(await kube_api.connect(settings), settings.namespace)
    slow = kube.faults.inject(0, verb="create", resource="secrets", delay=4.0)
    secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
              "metadata": {"name": "slow-answer"}, "stringData": {"token": "t"}}
    try:
        began = time.monotonic()
        created = await client.create(secret)
        took = time.monotonic() - began
    finally:
        await client.close()
    assert created["metadata"]["name"] == "slow-answer"
    assert slow.hits == 1
    assert took < 4.0, took  # it did not wait for the slow answer
    # Two requests reached the server (the slow one and the retry), one Secret exists.
    assert kube.counters.snapshot()[("create", "secrets")] == 2
    names = [s["metadata"]["name"] for s in kube.objects("secrets")]
    assert names.count("slow-answer") == 1, names
    wait_for(lambda: slow.waited == 1, timeout=30, what="the slow request to be served")
