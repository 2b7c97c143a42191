"""The hub restarts in the middle of a preemption (issue 25): a notebook waiting for the GPU a
trial is giving up (in its grace period, its checkpoint saved) when the hub goes down and comes
back. The waiting spawn ends with the hub; the tuner, the hub's service, goes and comes back
with it; nothing is lost: the trial, back in the queue, resumes from the checkpoint it saved
and finishes once, the GPU is not kept for the spawn that is gone, and the person's next spawn
gets it.

Same real parts as ``test_preemption``: JupyterHub with tunehub's local spawner, the tuner
service, real trial processes and a real notebook server, one GPU id as a lock file."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import pytest

from tests.polling import wait_for
from tests.service_fixtures import TunerHub
from tests.test_preemption import (  # noqa: F401 -- gpu_hub: the fixture
    SUBMIT,
    _answer,
    _hub,
    gpu_hub,
    submit_one_gpu_trial,
)

pytestmark = pytest.mark.slow


def test_a_hub_restarted_mid_preemption_loses_nothing(gpu_hub: TunerHub) -> None:  # noqa: F811
    hub = gpu_hub
    ana = hub.client(hub.token("ana", SUBMIT))
    sweep_id = submit_one_gpu_trial(hub, ana)

    def trial() -> dict[str, Any]:
        trials = _answer(ana, f"sweeps/{sweep_id}/trials")
        return trials[0] if trials else {}

    wait_for(lambda: (trial().get("last_step") or 0) >= 2, timeout=180,
             what="the trial to train and checkpoint two steps")
    before = trial()
    _hub(hub, "POST", "users/bob")
    asked: list[object] = []  # the spawn request's answer, or how it was cut

    def ask() -> None:
        try:
            asked.append(_hub(hub, "POST", "users/bob/server", json={"profile": "gpu-1"}))
        except httpx.HTTPError as exc:
            asked.append(exc)
    spawn = threading.Thread(target=ask, daemon=True)
    spawn.start()
    wait_for(lambda: "SIGTERM: checkpoint saved" in ana.get(
        f"sweeps/{sweep_id}/trials/0/logs").text, timeout=120,
        what="the preempted trial to save its checkpoint in its grace period")

    hub.restart()  # bob's spawn is still waiting for the GPU
    spawn.join(timeout=60)
    assert asked, "bob's spawn request did not end with the hub"
    assert _hub(hub, "GET", "users/bob").json()["servers"] == {}  # the waiting spawn ended

    # Nobody waits any more: the trial runs again, from its checkpoint, and the sweep ends
    # with it counted once.
    done = wait_for(lambda: (s := _answer(ana, f"sweeps/{sweep_id}")) and s.get("state") in (
        "completed", "failed") and s, timeout=300, what="the sweep to end after the restart")
    assert done["state"] == "completed" and done["failed"] == 0, done
    final = trial()
    assert (final["number"], final["state"], final["params"]) == (0, "completed",
                                                                  before["params"])
    assert len(_answer(ana, f"sweeps/{sweep_id}/trials")) == 1
    log = ana.get(f"sweeps/{sweep_id}/trials/0/logs").text
    record = json.loads(log.split("RECORD ", 1)[1].splitlines()[0])
    assert record["resumed"] == 1 and record["sigterm"] is True, record
    first = record["steps"].count("1")
    assert first >= 2 and record["steps"][first:] == [record["steps"][-1]] * 2  # continued
    assert final["value"] == pytest.approx(first + 2)

    # The GPU is nobody's now, and bob's next spawn gets it.
    pool = _answer(ana, "pool")
    assert pool["held"] == 0 and pool["queue"] == [], pool
    r = _hub(hub, "POST", "users/bob/server", json={"profile": "gpu-1"})
    assert r.status_code in (201, 202), r.text
    wait_for(lambda: _hub(hub, "GET", "users/bob").json()["servers"].get("", {}).get("ready"),
             timeout=120, what="bob's notebook after the restart")
    holder = _answer(ana, "pool")["gpus"][0]["holder"]
    assert holder is not None and (holder["person"], holder["kind"]) == ("bob", "notebook")
