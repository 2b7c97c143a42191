"""A notebook that needs a GPU preempts a trial, locally (issue 25): the trial is SIGTERMed,
given its grace period, recorded as preempted (not failed, no retry), and runs again from its
checkpoint with the same number and parameters once the notebook is gone; meanwhile the
notebook waits with its position and reason on JupyterHub's spawn progress.

The end-to-end test runs a real JupyterHub whose spawner is tunehub's local one, the real
tuner service, real trial processes and a real notebook server, with one GPU id as a lock file
(``TUNEHUB_LOCAL_GPUS=0``, no CUDA needed)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.polling import wait_for
from tests.service_fixtures import TunerHub, running_tuner_hub
from tests.sweeps_helpers import write_sweep
from tunehub_base import pool_secret
from tunehub_base.ordinal import ordinal
from tunehub_base.pool import FairPolicy, GpuRequest, Preemption, Scheduler
from tuner.db import Database, SweepRow
from tuner.lifecycle.ledger import Ledger
from tuner.lifecycle.states import (
    ATTEMPT_OUTCOMES,
    TRIAL_TRANSITIONS,
    EventKind,
    SweepState,
    TrialState,
)
from tuner.lifecycle.trial_paths import TrialPaths

# --- the lifecycle: a preempted attempt ------------------------------------------------------


def test_a_preemption_is_an_outcome_that_uses_no_retry() -> None:
    assert EventKind.PREEMPTED.is_final()
    assert not EventKind.PREEMPTED.uses_a_retry()
    assert EventKind.FAILED.uses_a_retry() and not EventKind.SUCCEEDED.uses_a_retry()
    assert not EventKind.STARTED.is_final() and not EventKind.WAITING.uses_a_retry()
    assert set(ATTEMPT_OUTCOMES) == {k for k in EventKind if k.is_final()}
    # Back to the queue is the transition a retry takes, and the table says it is also this.
    assert "preemption" in TRIAL_TRANSITIONS[(TrialState.RUNNING, TrialState.PENDING)]


def test_the_ledger_counts_preemptions_apart_from_attempts(db_url: str, tmp_path: Path) -> None:
    db = Database(db_url)
    ledger = Ledger(db)
    with db.session() as s:
        sweep = SweepRow(name="s", owner="ana", spec={}, backend="local", study_name="st",
                         state=SweepState.RUNNING)
        s.add(sweep)
        s.flush()
        sweep_id = sweep.id
    paths = TrialPaths.new(tmp_path / "sweep", 0)
    trial_id = ledger.add_trial(sweep_id, 0, 1, {"x": 0.5}, paths)
    first = ledger.start_attempt(sweep_id, trial_id, "h1")
    assert (first.attempt, first.preemptions) == (1, 0)
    ledger.requeue([trial_id], "preempted", preempted=True)
    row = next(t for t in ledger.trials(sweep_id) if t.id == trial_id)
    assert (row.state, row.preemptions, row.reason, row.token_hash) == (
        TrialState.PENDING, 1, "preempted", None)
    second = ledger.start_attempt(sweep_id, trial_id, "h2")
    assert (second.attempt, second.preemptions, second.params) == (2, 1, {"x": 0.5})
    ledger.requeue([trial_id], "retry after a failure")  # a retry is counted as before
    row = next(t for t in ledger.trials(sweep_id) if t.id == trial_id)
    assert (row.attempts, row.preemptions) == (2, 1)


# --- the policy laid over the locks -----------------------------------------------------------


def _trial(rid: str, person: str, priority: str = "normal", since: float = 0.0) -> GpuRequest:
    return GpuRequest(rid, person, "trial", 1, since, priority=priority, sweep_id="1",
                      trial_number=int(rid[-1]))


def test_adopted_holdings_are_preempted_once_and_notebooks_never() -> None:
    scheduler = Scheduler(["0", "1"], FairPolicy(trials_preempt=False), clock=lambda: 100.0)
    scheduler.adopt(GpuRequest("nb:cat/", "cat", "notebook", 1, 1.0), ["1"], 1.0)
    scheduler.adopt(_trial("t0", "ana", "low"), ["0"], 2.0)
    # A high-priority trial waits (only notebooks preempt here): no stop for it.
    waiting_trial = scheduler.submit(_trial("t9", "ana", "high", 5.0))
    assert not waiting_trial.started and waiting_trial.actions == []
    decision = scheduler.submit(GpuRequest("nb:bob/", "bob", "notebook", 1, 10.0))
    assert [type(a) for a in decision.actions] == [Preemption]
    victim = decision.actions[0]
    assert isinstance(victim, Preemption) and victim.victim.request_id == "t0"
    assert decision.position == 1 and "stopping" in decision.reason

    # The next look at the pool: the victim is still on its way out; nothing more is stopped,
    # and the notebook is still first in line.
    again = Scheduler(["0", "1"], FairPolicy(trials_preempt=False), clock=lambda: 101.0)
    again.adopt(GpuRequest("nb:cat/", "cat", "notebook", 1, 1.0), ["1"], 1.0)
    again.adopt(_trial("t0", "ana", "low"), ["0"], 2.0, stopping_for="nb:bob/")
    second = again.submit(GpuRequest("nb:bob/", "bob", "notebook", 1, 10.0))
    assert second.actions == [] and second.position == 1
    assert [h.request_id for h in again.stopping_for("nb:bob/")] == ["t0"]
    # A second notebook finds only a notebook left: it waits, behind the first.
    third = again.submit(GpuRequest("nb:dan/", "dan", "notebook", 1, 11.0))
    assert third.actions == [] and third.position == 2
    with pytest.raises(ValueError):
        again.adopt(_trial("t1", "ana"), ["0"], 3.0)  # that GPU is held


def test_ordinals() -> None:
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th"]


def test_the_spawners_secret_is_made_once_and_never_through_a_link(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    secret = pool_secret.pool_secret(locks)
    assert len(secret) == 2 * pool_secret.SECRET_BYTES
    assert pool_secret.pool_secret(locks) == secret
    assert (locks / pool_secret.SECRET_FILE).stat().st_mode & 0o777 == 0o600
    assert pool_secret.matches(secret, locks) and not pool_secret.matches("x" + secret, locks)
    assert not pool_secret.matches("", locks)
    other = tmp_path / "other"
    other.mkdir()
    target = tmp_path / "precious"
    target.write_text("mine")
    (other / pool_secret.SECRET_FILE).symlink_to(target)
    with pytest.raises(OSError):
        pool_secret.pool_secret(other)
    assert target.read_text() == "mine"


# --- the spawner's wait, with the tuner down ---------------------------------------------------


def test_a_waiting_notebook_outlives_a_silent_tuner_and_gives_up_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tuner does not answer (nothing listens): the notebook keeps waiting with that
    reason on its spawn page, and after ``gpu_wait_timeout`` its spawn fails saying why."""
    from types import SimpleNamespace

    from hub.local_spawner import TunehubLocalSpawner
    from hub.spawn_refused import SpawnRefused
    from tests.service_fixtures import free_port
    from tunehub_base.gpu_holders import Holder
    from tunehub_base.gpus import GpuPool

    monkeypatch.setenv("TUNEHUB_LOCAL_GPUS", "0")
    locks = tmp_path / "locks"
    trial = GpuPool(locks, ["0"])
    assert trial.acquire(1, Holder.trial_attempt("ana", 1, 0, 1)) == ["0"]
    spawner = TunehubLocalSpawner(
        user=SimpleNamespace(name="bob", groups=[], url="/user/bob/"), gpu_lock_dir=str(locks),
        pool_queue_url=f"http://127.0.0.1:{free_port()}/services/tuner/api/v1/pool/requests",
        gpu_wait_timeout=3, gpu_poll_interval=0.2)

    async def wait() -> tuple[list[str], str]:
        seen: list[str] = []

        async def watch() -> None:
            async for event in spawner.progress():
                seen.append(event["message"])

        watcher = asyncio.ensure_future(watch())
        with pytest.raises(SpawnRefused) as refused:
            await spawner._take_gpus(1)
        await asyncio.wait_for(watcher, timeout=30)
        assert spawner._withdrawal is not None
        await asyncio.wait_for(spawner._withdrawal, timeout=30)  # nobody hears it: no error
        return seen, str(refused.value)

    seen, refusal = asyncio.run(wait())
    assert seen[0].startswith("waiting for a GPU: the tuner (which can stop a trial for you) "
                              "does not answer"), seen
    assert all(m.startswith("waiting for a GPU") for m in seen), seen  # never "taken"
    assert refusal.startswith("no GPU became free for you within 3 s (gpu_wait_timeout)")
    assert "does not answer" in refusal and "CPU-only server" in refusal
    trial.release(["0"])


# --- end to end: a notebook preempts a trial -------------------------------------------------

# The first attempt trains until it is stopped; on SIGTERM it saves a checkpoint and then keeps
# "finishing its epoch" until the grace period's SIGKILL. An attempt that restored a checkpoint
# trains two more steps and ends with its result: the total number of steps.
TRAIN = """
import json, os, signal, time
import tuner

p = tuner.params()
found = tuner.restore()
state, step = found if found else ({"steps": [], "resumed": 0, "sigterm": False}, 0)
attempt = os.environ["TUNEHUB_TRIAL_ATTEMPT"]
state["resumed"] += 1 if found else 0
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
end = step + 2 if found else None
while end is None or step < end:
    if stop:
        state["sigterm"] = True
        tuner.checkpoint(state, step)
        print("SIGTERM: checkpoint saved at step", step, flush=True)
        while True:
            time.sleep(1)  # still finishing its epoch when the grace period ends
    step += 1
    state["steps"].append(attempt)
    tuner.report(p["x"] + step, step=step)
    tuner.checkpoint(state, step)
    time.sleep(0.5)  # one step of training
print("RECORD", json.dumps({**state, "params": p}), flush=True)
tuner.report(float(step))
"""

GRACE_SECONDS = 30
SUBMIT = ["custom:tuner:read", "custom:tuner:submit", "access:services!service=tuner"]

SPAWNER_CONFIG = """
c.JupyterHub.spawner_class = "hub.local_spawner.TunehubLocalSpawner"
c.Spawner.cmd = [sys.executable, "-m", "jupyterhub.singleuser"]
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
c.TunehubLocalSpawner.unix_users = False
c.TunehubLocalSpawner.profiles = [
    {{"slug": "cpu", "display_name": "CPU only", "gpus": 0, "default": True}},
    {{"slug": "gpu-1", "display_name": "1 GPU", "gpus": 1}},
]
c.TunehubLocalSpawner.pool_queue_url = (
    "http://127.0.0.1:{service_port}/services/tuner/api/v1/pool/requests")
c.TunehubLocalSpawner.gpu_wait_timeout = 300
c.JupyterHub.load_roles[1]["scopes"].append("admin:servers")
"""


@pytest.fixture
def gpu_hub(tmp_path: Path) -> Iterator[TunerHub]:
    with running_tuner_hub(
        tmp_path, f"sqlite:///{tmp_path / 'tunehub.sqlite'}",
        extra_env={"TUNEHUB_LOCAL_GPUS": "0",
                   "TUNEHUB_PREEMPT_GRACE_SECONDS": str(GRACE_SECONDS)},
        extra_config=SPAWNER_CONFIG,
    ) as hub:
        try:
            yield hub
        finally:  # the notebook server, if the test left it running
            httpx.delete(f"{hub.url}hub/api/users/bob/server", timeout=60,
                         headers={"Authorization": f"token {hub.admin_token}"})


class Progress:
    """Reads a spawn's progress events (JupyterHub's event stream) in a thread."""

    def __init__(self, hub: TunerHub, user: str) -> None:
        self.messages: list[str] = []
        self.url = f"{hub.url}hub/api/users/{user}/server/progress"
        self.headers = {"Authorization": f"token {hub.admin_token}"}
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        with httpx.stream("GET", self.url, headers=self.headers, timeout=600) as r:
            for line in r.iter_lines():
                if line.startswith("data:"):
                    event = json.loads(line[5:])
                    self.messages.append(str(event.get("message")))


def _hub(hub: TunerHub, method: str, path: str, **kwargs: Any) -> httpx.Response:
    return httpx.request(method, f"{hub.url}hub/api/{path}", timeout=60,
                         headers={"Authorization": f"token {hub.admin_token}"}, **kwargs)


def submit_one_gpu_trial(hub: TunerHub, client: httpx.Client) -> int:
    """A sweep of one checkpointing 1-GPU trial (``TRAIN``), submitted by ``client``: the
    trial a notebook's request preempts."""
    path = write_sweep(hub.data / "code", TRAIN, trials=1, parallelism=1, max_retries=0,
                       pruner="none", direction="maximize", resources={"gpu": 1},
                       trial_timeout="10m")
    spec = yaml.safe_load(path.read_text())
    spec["code"] = str(path.parent)
    r = client.post("sweeps", json={"spec": spec})
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def test_a_gpu_notebook_preempts_a_trial_which_resumes_from_its_checkpoint(
    gpu_hub: TunerHub,
) -> None:
    hub = gpu_hub
    ana = hub.client(hub.token("ana", SUBMIT))
    bob_token = hub.token("bob", SUBMIT)
    bob = hub.client(bob_token)
    sweep_id = submit_one_gpu_trial(hub, ana)

    def trial() -> dict[str, Any]:
        trials = ana.get(f"sweeps/{sweep_id}/trials").json()
        assert len(trials) <= 1, trials
        return trials[0] if trials else {}

    def gpu_holder() -> dict[str, Any]:
        return bob.get("pool").json()["gpus"][0]["holder"] or {}

    # The trial holds the only GPU and has checkpointed a few steps.
    wait_for(lambda: (trial().get("last_step") or 0) >= 2, timeout=180,
             what="the trial to train and checkpoint two steps")
    before = trial()
    assert gpu_holder()["kind"] == "trial" and gpu_holder()["person"] == "ana"

    # Only the hub's spawner may queue notebooks: a person's token, or none, is refused, and
    # a bad ask is a 400 naming its field.
    requests = f"{hub.url}services/tuner/api/v1/pool/requests"
    assert bob.post("pool/requests", json={"person": "bob", "gpus": 1}).status_code == 401
    assert httpx.post(requests, json={"person": "bob", "gpus": 1}, timeout=30).status_code == 401
    secret = pool_secret.pool_secret(Path(hub.env["TUNEHUB_HOME"]) / "gpu-locks")
    spawner = {"Authorization": f"token {secret}"}
    for body, field in (({"person": "bob", "gpus": 2}, "gpus"), ({"gpus": 1}, "person"),
                        ({"person": "bob", "gpus": 1, "groups": "x"}, "groups")):
        bad = httpx.post(requests, json=body, headers=spawner, timeout=30)
        assert bad.status_code == 400 and bad.json()["field"] == field, bad.text
    assert trial()["state"] == "running"  # nothing of that stopped anything

    # Bob starts a GPU notebook: it waits, first in line, while the trial is preempted.
    spawn = threading.Thread(target=_hub, args=(hub, "POST", "users/bob/server"),
                             kwargs={"json": {"profile": "gpu-1"}}, daemon=True)
    _hub(hub, "POST", "users/bob")
    spawn.start()
    wait_for(lambda: _hub(hub, "GET", "users/bob").json()["servers"].get("", {}).get(
        "pending") == "spawn", timeout=60, what="bob's spawn to be pending")
    progress = Progress(hub, "bob")
    expected = f"waiting for a GPU: 1st in line, preempting trial 0 of sweep {sweep_id} (ana)"
    wait_for(lambda: expected in progress.messages, timeout=2 * GRACE_SECONDS,
             what=f"the spawn page to say {expected!r} (got {progress.messages})")
    queue = bob.get("pool").json()["queue"]
    assert [(q["position"], q["person"], q["kind"]) for q in queue] == [(1, "bob", "notebook")]
    assert queue[0]["reason"] == f"preempting trial 0 of sweep {sweep_id} (ana)"
    assert gpu_holder()["person"] == "ana"  # still in its grace period

    # The notebook gets the GPU once the trial is gone; the trial is pending, not failed.
    wait_for(lambda: _hub(hub, "GET", "users/bob").json()["servers"].get("", {}).get("ready"),
             timeout=240, what="bob's notebook to run")
    spawn.join(timeout=60)
    progress.thread.join(timeout=60)
    assert progress.messages[-2:] == ["GPU taken: starting your server",
                                      progress.messages[-1]], progress.messages
    assert gpu_holder()["kind"] == "notebook" and gpu_holder()["person"] == "bob"
    stopped = wait_for(lambda: (t := trial())["state"] == "pending" and t, timeout=60,
                       what="the preempted trial to be back in the queue")
    assert (stopped["attempts"], stopped["preemptions"]) == (1, 1)
    assert stopped["reason"].startswith("preempted: its GPU went to a notebook or a higher")
    assert f"killed after its {GRACE_SECONDS}s grace period" in stopped["reason"]
    sweep = ana.get(f"sweeps/{sweep_id}").json()
    assert sweep["state"] == "running" and sweep["failed"] == 0
    pool = bob.get("pool").json()
    assert [(q["position"], q["person"], q["kind"], q["what"]) for q in pool["queue"]] == [
        (1, "ana", "trial", f"sweep {sweep_id} trial 0")]
    shares = {row["person"]: row for row in pool["shares"]}
    assert shares["bob"]["held_gpus"] == 1 and shares["ana"]["waiting_gpus"] == 1
    # tunehub pool, from bob's notebook terminal (the service's view), shows the queue too.
    cli = subprocess.run(
        [str(Path(sys.executable).parent / "tunehub"), "pool"], capture_output=True, text=True,
        timeout=120, env={**os.environ, "TUNEHUB_API_URL": f"{hub.url}services/tuner/",
                          "TUNEHUB_TOKEN": bob_token, "COLUMNS": "200"})
    assert cli.returncode == 0, cli.stderr
    assert "Waiting for GPUs" in cli.stdout and f"sweep {sweep_id} trial 0" in cli.stdout
    assert trial()["state"] == "pending"  # it does not run beside the notebook

    # Bob stops his notebook: the trial runs again, same number and parameters, from its
    # checkpoint, and completes; max_retries is 0 and was not used up.
    assert _hub(hub, "DELETE", "users/bob/server").status_code in (202, 204)
    done = wait_for(lambda: (s := ana.get(f"sweeps/{sweep_id}").json())["state"] in (
        "completed", "failed") and s, timeout=240, what="the sweep to end")
    assert done["state"] == "completed", done
    assert (done["completed"], done["failed"]) == (1, 0)
    final = trial()
    assert (final["number"], final["state"], final["params"]) == (
        0, "completed", before["params"])
    assert (final["attempts"], final["preemptions"]) == (2, 1)
    log = ana.get(f"sweeps/{sweep_id}/trials/0/logs").text
    assert "SIGTERM: checkpoint saved at step" in log
    record = json.loads(log.split("RECORD ", 1)[1].splitlines()[0])
    assert record["params"] == before["params"] and record["sigterm"] is True
    assert record["resumed"] == 1
    first = record["steps"].count("1")
    assert first >= 2 and record["steps"] == ["1"] * first + ["2", "2"]  # continued, not redone
    assert final["value"] == pytest.approx(first + 2)
    assert bob.get("pool").json()["queue"] == []
    metrics = httpx.get(f"{hub.url}services/tuner/metrics", timeout=30,
                        headers={"Authorization": f"token {hub.admin_token}"}).text
    assert "tunehub_trial_attempts_preempted_total 1.0" in metrics
    # How long the notebook waited: the trial's grace period (it saved its checkpoint at once
    # but lingered until SIGKILL), plus the moments to notice the freed GPU.
    waited = re.search(r"server for bob: got 1 GPU\(s\) after ([0-9.]+)s in the queue",
                       hub.log.read_text())
    assert waited is not None
    print(f"bob's notebook waited {waited.group(1)} s for the GPU (grace {GRACE_SECONDS} s)")
    assert GRACE_SECONDS <= float(waited.group(1)) < GRACE_SECONDS + 60


# --- a tuner restart in the middle of a preemption ---------------------------------------------


def _tuner_pid(hub: TunerHub) -> int:
    """The tuner service process the hub started for this test (found by its home)."""
    home = f"TUNEHUB_HOME={hub.env['TUNEHUB_HOME']}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"tuner.service" in argv and home in environ:
            return int(entry.name)
    raise AssertionError("the tuner service process is not running")


def test_a_tuner_killed_mid_preemption_loses_nothing(gpu_hub: TunerHub) -> None:
    """The tuner dies while the trial it preempts for a waiting notebook is in its grace period
    (checkpoint saved): the notebook still gets the GPU, the hub starts the tuner again, and the
    trial, back in the queue, resumes from that checkpoint once the notebook is gone."""
    hub = gpu_hub
    ana = hub.client(hub.token("ana", SUBMIT))
    sweep_id = submit_one_gpu_trial(hub, ana)

    def trial() -> dict[str, Any]:
        trials = ana.get(f"sweeps/{sweep_id}/trials").json()
        return trials[0] if trials else {}

    wait_for(lambda: (trial().get("last_step") or 0) >= 2, timeout=180,
             what="the trial to train and checkpoint two steps")
    before = trial()
    spawn = threading.Thread(target=_hub, args=(hub, "POST", "users/bob/server"),
                             kwargs={"json": {"profile": "gpu-1"}}, daemon=True)
    _hub(hub, "POST", "users/bob")
    spawn.start()
    wait_for(lambda: "SIGTERM: checkpoint saved" in ana.get(
        f"sweeps/{sweep_id}/trials/0/logs").text, timeout=120,
        what="the preempted trial to save its checkpoint in its grace period")
    first_tuner = _tuner_pid(hub)
    os.kill(first_tuner, 9)  # a crash, in the middle of the grace period

    # The notebook gets the GPU (freed with the tuner's trial); the hub starts the tuner again.
    wait_for(lambda: _hub(hub, "GET", "users/bob").json()["servers"].get("", {}).get("ready"),
             timeout=240, what="bob's notebook to run")
    spawn.join(timeout=60)
    wait_for(lambda: _tuner_pid_or_none(hub) not in (None, first_tuner), timeout=120,
             what="the hub to start the tuner again")
    back = wait_for(lambda: _answer(ana, f"sweeps/{sweep_id}/trials") and (
        t := trial()).get("state") == "pending" and t, timeout=180,
        what="the trial to be back in the queue after the restart")
    assert back["params"] == before["params"] and back["number"] == 0
    holder = _answer(ana, "pool")["gpus"][0]["holder"]
    assert holder is not None and (holder["person"], holder["kind"]) == ("bob", "notebook")

    # Bob stops his notebook: the trial resumes from the checkpoint saved before the crash.
    assert _hub(hub, "DELETE", "users/bob/server").status_code in (202, 204)
    done = wait_for(lambda: (s := _answer(ana, f"sweeps/{sweep_id}")) and s.get("state") in (
        "completed", "failed") and s, timeout=240, what="the sweep to end")
    assert done["state"] == "completed" and done["failed"] == 0, done
    final = trial()
    assert (final["number"], final["state"], final["params"]) == (0, "completed",
                                                                  before["params"])
    log = ana.get(f"sweeps/{sweep_id}/trials/0/logs").text
    record = json.loads(log.split("RECORD ", 1)[1].splitlines()[0])
    assert record["resumed"] == 1 and record["sigterm"] is True
    first = record["steps"].count("1")
    assert first >= 2 and record["steps"][first:] == [record["steps"][-1]] * 2  # continued
    assert final["value"] == pytest.approx(first + 2)


def _tuner_pid_or_none(hub: TunerHub) -> int | None:
    try:
        return _tuner_pid(hub)
    except AssertionError:
        return None


def _answer(client: httpx.Client, path: str) -> Any:
    """The tuner's JSON answer, or None while it is down (the proxy's 503/404)."""
    try:
        r = client.get(path)
    except httpx.HTTPError:
        return None
    return r.json() if r.status_code == 200 else None
