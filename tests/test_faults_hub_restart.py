"""The hub is killed (SIGKILL) or stopped (SIGTERM) under ``tunehub up`` while a person's
notebook server runs and a sweep's trials report: ``tunehub up`` starts the hub again, which
finds the same server (same pid) and adopts the same proxy with its routes; the person's
browser session (their cookies) goes on without logging in again, and the sweep completes with
each trial once. Ctrl-C afterwards still stops the server and the proxy.

The tuner runs on too: its keeper is detached from the hub (tuner.detached_keeper), the new hub's
managed service finds it, and the same tuner process serves throughout; the trials that were
running keep running and report through the restart (each trial one attempt). Ctrl-C stops the
tuner with the rest.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fault_records import FaultRecord, record
from tests.hub_fixtures import Platform, parent_of
from tests.polling import wait_for
from tests.test_faults_tuner_killed import (
    PARALLEL,
    STEPS,
    TRIALS,
    submit_gated_sweep,
    tuner_processes,
)
from tests.test_hub_platform import Hub, login_token
from tunehub_base.pid_files import recorded_process
from tunehub_base.process_identity import ProcessIdentity

pytestmark = [pytest.mark.slow]



def browser_login(url: str, username: str, password: str) -> httpx.Client:
    """A client holding a person's login cookies, as a browser would after the login form."""
    client = httpx.Client(base_url=url, timeout=30, follow_redirects=True)
    page = client.get("hub/login")
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page.text)
    assert xsrf, page.text[:2000]
    client.post("hub/login", data={"username": username, "password": password,
                                   "_xsrf": xsrf.group(1)})
    assert "jupyterhub-session-id" in client.cookies, "login failed"
    return client


def hub_process(state: Path) -> ProcessIdentity | None:
    return recorded_process(state / "jupyterhub.pid", b"jupyterhub")


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_hub_killed_keeps_servers_proxy_sessions_and_sweeps(
    platform: Platform, how: signal.Signals
) -> None:
    base = platform.home.parent
    record_dir, gate = base / "record", base / "gate"
    record_dir.mkdir(mode=0o777)
    record_dir.chmod(0o777)  # the trials run as the person's own Unix user (as root)
    state = platform.home / "hub"
    platform.start()
    assert platform.password, platform.output
    hub = Hub(platform.url, login_token(platform.url, "admin", platform.password))
    browser = browser_login(platform.url, "admin", platform.password)

    # The person's notebook server, reached through the proxy with their cookies.
    hub.start_server("admin", "cpu")
    assert _server_page(browser)
    server = hub.call("GET", "hub/api/users/admin", 200)["servers"][""]
    server_pid = int(server["state"]["pid"])
    server_proc = ProcessIdentity.of(server_pid)

    api = submit_gated_sweep(platform, hub, "hub-killed", record_dir, gate)
    wait_for(lambda: sum(p.name.endswith("-1") for p in record_dir.iterdir()) >= PARALLEL,
             timeout=300, what="two trials running and reporting")

    (old_tuner,) = tuner_processes(platform.home)
    keeper = ProcessIdentity.of(parent_of(old_tuner.pid))
    old_hub = hub_process(state)
    proxy = recorded_process(state / "proxy.pid", b"hub.proxy")
    assert old_hub is not None and proxy is not None
    os.kill(old_hub.pid, how)
    killed_at = time.monotonic()
    wait_for(lambda: old_hub.alive() is False, timeout=90, what="the hub to end")
    # The proxy the hub started is no child whose life ends with it: it routes on meanwhile.
    assert _server_page(browser)

    new_hub = wait_for(lambda: (h := hub_process(state)) is not None and h != old_hub and h,
                       timeout=240, what="tunehub up to start the hub again")
    wait_for(lambda: _answers(platform.url), timeout=240, what="the new hub to answer")
    back_at = time.monotonic()
    assert new_hub is not None and platform.process is not None
    assert platform.process.poll() is None, platform.output  # tunehub up itself runs on

    # The same proxy (adopted, not replaced), the same server process, the same session.
    assert recorded_process(state / "proxy.pid", b"hub.proxy") == proxy
    assert proxy.alive()
    after = hub.call("GET", "hub/api/users/admin", 200)["servers"][""]
    assert after["ready"] and int(after["state"]["pid"]) == server_pid, after
    assert server_proc.alive()  # the very process, not a new one that took its pid
    assert _server_page(browser)
    home = browser.get("hub/home")
    assert home.status_code == 200 and "hub/login" not in str(home.url), str(home.url)

    # The sweep: the very tuner process serves behind the new hub, under the same keeper.
    wait_for(platform._tuner_ready, timeout=240, what="the tuner behind the new hub")
    assert tuner_processes(platform.home) == [old_tuner] and old_tuner.alive()
    assert keeper.alive() and parent_of(old_tuner.pid) == keeper.pid
    gate.touch()

    def ended() -> dict[str, Any] | None:
        view: dict[str, Any] = hub.call("GET", api, 200)
        return view if view["state"] in ("completed", "failed") else None

    done = wait_for(ended, timeout=600, what="the sweep to end")
    assert done is not None and done["state"] == "completed", done
    trials = hub.call("GET", f"{api}/trials", 200)
    assert sorted(t["number"] for t in trials) == list(range(TRIALS)), trials
    assert all(t["state"] == "completed" for t in trials), trials
    for t in trials:  # each step once, whatever attempt sent it
        assert sorted(r["step"] for r in t["intermediate_values"]) == list(range(1, STEPS + 1)), t
    # Nothing was interrupted: the trials running through the restart ran on, once each.
    assert all(t["attempts"] == 1 for t in trials), trials
    log = (state / "hub.log").read_text(errors="replace")
    assert "Adopting the running proxy" in log, log[-3000:]
    assert f"the tuner's keeper (pid {keeper.pid}) runs on" in log, log[-3000:]
    browser.close()

    # Ctrl-C still stops everything: the server (through the hub's API), the tuner and the
    # proxy too.
    assert platform.stop() == 0, platform.output
    wait_for(lambda: server_proc.alive() is False, timeout=60, what="the server to stop")
    wait_for(lambda: proxy.alive() is False, timeout=60, what="the proxy to stop")
    assert keeper.alive() is False and old_tuner.alive() is False
    assert tuner_processes(platform.home) == []
    record(FaultRecord(
        fault=f"hub stopped by {how.name} under `tunehub up`",
        duration_s=round(back_at - killed_at, 1), sweeps=1, trials=TRIALS, running=PARALLEL,
        lost=0, recover_s=round(back_at - killed_at, 1),
        seen="the notebook server (same process) answered through the same proxy throughout, "
             "with the same login; hub pages back after the restart; the same tuner process "
             f"served throughout and its {PARALLEL} running trials ran on (one attempt each); "
             "the sweep completed"))


def _server_page(browser: httpx.Client) -> bool:
    """The person's JupyterLab page, with their cookies only: it answers without a login."""
    page = browser.get("user/admin/lab")
    assert page.status_code == 200, (page.status_code, str(page.url))
    assert str(page.url).endswith("/user/admin/lab"), str(page.url)  # no login on the way
    return True


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}hub/api/", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


# --- the hub killed in the middle of a preemption (issue 25) ---------------------------------


def test_hub_killed_mid_preemption_loses_nothing(platform: Platform) -> None:
    """One GPU id under ``tunehub up``: the admin's checkpointing trial holds it, bob's GPU
    notebook asks for it, and the trial, preempted, saves its checkpoint in its grace period;
    then the hub is SIGKILLed (the tuner, detached from it, runs on). ``tunehub up`` starts
    the hub again: bob's interrupted spawn holds nothing (his server is not running, and his
    place in the pool's queue lapses, as its spawner no longer asks), and the trial comes back
    as the same trial, not failed and no retry spent, and resumes from the checkpoint it
    saved."""
    from tests.test_preemption import TRAIN

    platform.env.update({"TUNEHUB_LOCAL_GPUS": "0", "TUNEHUB_PREEMPT_GRACE_SECONDS": "60"})
    state = platform.home / "hub"
    code = platform.data / "preempted"
    code.mkdir(parents=True)
    (code / "train.py").write_text(TRAIN)
    platform.start()
    assert platform.password, platform.output
    hub = Hub(platform.url, login_token(platform.url, "admin", platform.password))
    spec = {"name": "preempted", "code": str(code), "command": "python train.py",
            "metric": "score", "direction": "maximize", "trials": 1, "parallelism": 1,
            "max_retries": 0, "pruner": "none", "resources": {"gpu": 1},
            "space": {"x": {"type": "float", "low": 0, "high": 1}}}
    api = "services/tuner/api/v1/sweeps/" + str(
        hub.call("POST", "services/tuner/api/v1/sweeps", 201, json={"spec": spec})["id"])

    def trial() -> dict[str, Any]:
        try:
            trials = hub.call("GET", f"{api}/trials", 200)
        except (AssertionError, httpx.HTTPError):  # the tuner is down, or not back yet
            return {}
        return trials[0] if trials else {}

    wait_for(lambda: (trial().get("last_step") or 0) >= 2, timeout=240,
             what="the trial to train and checkpoint two steps")
    before = trial()
    hub.call("POST", "hub/api/users/bob", 201)
    hub.call("POST", "hub/api/users/bob/server", (201, 202), json={"profile": "gpu-1"})
    wait_for(lambda: "SIGTERM: checkpoint saved" in hub.client.get(
        f"{api}/trials/0/logs").text, timeout=120,
        what="the preempted trial to save its checkpoint in its grace period")
    saved_at = trial()["last_step"]
    old_hub = hub_process(state)
    assert old_hub is not None
    os.kill(old_hub.pid, signal.SIGKILL)
    wait_for(lambda: old_hub.alive() is False, timeout=90, what="the hub to end")

    wait_for(lambda: (h := hub_process(state)) is not None and h != old_hub, timeout=240,
             what="tunehub up to start the hub again")
    wait_for(lambda: _answers(platform.url), timeout=240, what="the new hub to answer")
    wait_for(platform._tuner_ready, timeout=240, what="the tuner back behind the new hub")
    # Bob's spawn died with the hub that was making it: no server, nothing queued for him.
    assert not hub.call("GET", "hub/api/users/bob", 200)["servers"].get("", {}).get("ready")

    done = wait_for(lambda: (s := hub.call("GET", api, 200))["state"] in (
        "completed", "failed") and s, timeout=300, what="the sweep to end")
    assert done["state"] == "completed" and done["failed"] == 0, done
    final = trial()
    assert (final["number"], final["state"], final["params"]) == (
        0, "completed", before["params"])
    log = hub.client.get(f"{api}/trials/0/logs").text
    record_line = json.loads(log.split("RECORD ", 1)[1].splitlines()[0])
    assert record_line["resumed"] >= 1 and record_line["sigterm"] is True, record_line
    # Continued from the checkpoint saved before the kill: two more steps, not a new start.
    assert final["value"] == pytest.approx(saved_at + 2), (final, saved_at)
    pool = hub.call("GET", "services/tuner/api/v1/pool", 200)
    assert pool["queue"] == [], pool
