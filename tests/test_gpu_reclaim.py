"""Idle GPUs given back (issue #26): a real hub and real notebook servers, each measuring its
own GPU through the real ``nvidia-ml-py`` loaded on the NVML stand-in, whose figures this test
writes. One hub, five GPU servers side by side: an idle one is warned inside JupyterLab (a
warning notification in the page, seen in real Chromium, and a notice in its file browser)
and then stopped, with the reason on the person's hub home page;
one whose GPU has a process on it, one mid-cell, one of an exempt group and one whose GPU is
lost are never stopped (the lost GPU is reported with the reason); bad reports are 400s. Through
``tunehub up`` (internal TLS), a server without NVML reports why and is kept."""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tornado.ioloop import IOLoop

from hub import gpu_reclaim_reasons
from hub.gpu_reclaim_reasons import StopReasons
from hub.notebook import SINGLEUSER_ARGS
from hub.singleuser.gpu_reclaim import NOTICE, IdleClock, Policy, lab_message, own_gpus
from tests import test_gpu_usage
from tests.hub_fixtures import Platform
from tests.nvml_standin import GPU_IS_LOST, GiB, StandIn
from tests.polling import wait_for
from tests.service_fixtures import TunerHub, running_tuner_hub
from tests.test_hub_browser import CHROMIUM, CHROMIUM_ARGS, login
from tests.test_hub_platform import Hub as HubApi
from tests.test_hub_platform import _run_busy_cell, login_token
from tunehub_base.gpu_usage import LOST, NO_LIBRARY, GpuReading

pytestmark = [pytest.mark.slow, pytest.mark.browser]

# The stand-in built once per session, with this test's figures file (test_gpu_usage's fixtures).
nvml_library, standin = test_gpu_usage.nvml_library, test_gpu_usage.standin

WARN, RECLAIM = 8, 10  # seconds: unused before the warning, then before the stop
PEOPLE = ["ann", "bob", "cat", "dan", "eve"]  # idle, busy, mid-cell, exempt, lost GPU

CONFIG = """
c.JupyterHub.spawner_class = "hub.local_spawner.TunehubLocalSpawner"
c.Spawner.cmd = [sys.executable, "-m", "jupyterhub.singleuser"]
c.Spawner.args = {args}
c.Spawner.environment = {environment}
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
c.TunehubLocalSpawner.unix_users = False
c.TunehubLocalSpawner.profiles = [
    {{{{"slug": "gpu-1", "display_name": "1 GPU", "gpus": 1, "default": True}}}},
]
c.TunehubLocalSpawner.pool_queue_url = (
    "http://127.0.0.1:{{service_port}}/services/tuner/api/v1/pool/requests")
c.JupyterHub.load_roles[1]["scopes"] += ["admin:servers", "access:servers",
                                         "read:users:activity"]
c.JupyterHub.load_groups = {{{{"gpu-vips": {{{{"users": ["dan"]}}}}}}}}
c.JupyterHub.template_paths = [{templates}]
from hub import gpu_reclaim
gpu_reclaim.configure(c, "{{home}}/state")
c.GpuReclaim.warn_after = {warn}
c.GpuReclaim.reclaim_after = {reclaim}
c.GpuReclaim.sample_seconds = 0.5
c.GpuReclaim.exempt = ["nobody", "group:gpu-vips"]
"""


def busy_gpu() -> dict[str, Any]:
    return {"util": 90, "mem_used": GiB, "mem_total": 16 * GiB}


def idle_gpu() -> dict[str, Any]:
    return {"util": 0, "mem_used": GiB, "mem_total": 16 * GiB}


def _literal(value: Any) -> str:
    """``value`` as Python source that survives the fixture's second ``str.format``."""
    return repr(value).replace("{", "{{").replace("}", "}}")


@pytest.fixture
def hub(standin: StandIn, tmp_path: Path) -> Iterator[TunerHub]:
    standin.set(*[busy_gpu() for _ in PEOPLE])  # nobody idles while the servers start
    templates = str(Path(__file__).resolve().parent.parent / "hub" / "templates")
    config = CONFIG.format(args=_literal(SINGLEUSER_ARGS), environment=_literal(standin.env),
                           templates=_literal(templates), warn=WARN, reclaim=RECLAIM)
    gpus = ",".join(str(i) for i in range(len(PEOPLE)))
    with running_tuner_hub(tmp_path, f"sqlite:///{tmp_path / 'tunehub.sqlite'}",
                           extra_env={"TUNEHUB_LOCAL_GPUS": gpus, **standin.env},
                           extra_config=config) as h:
        try:
            yield h
        finally:
            for person in PEOPLE:
                httpx.delete(f"{h.url}hub/api/users/{person}/server", timeout=60,
                             headers={"Authorization": f"token {h.admin_token}"})


class Hub:
    def __init__(self, hub: TunerHub) -> None:
        self.url = hub.url
        self.client = httpx.Client(base_url=f"{hub.url}hub/api/", timeout=60,
                                   headers={"Authorization": f"token {hub.admin_token}"})

    def server(self, user: str) -> dict[str, Any] | None:
        r = self.client.get(f"users/{user}")
        assert r.status_code == 200, r.text
        return r.json()["servers"].get("")

    def start(self, user: str) -> None:
        r = self.client.post(f"users/{user}/server", json={"profile": "gpu-1"})
        assert r.status_code in (201, 202), r.text
        wait_for(lambda: (self.server(user) or {}).get("ready"), timeout=120,
                 what=f"{user}'s GPU server")

    def use(self, user: str) -> dict[str, Any]:
        r = self.client.get(f"tunehub/gpu-use/{user}")
        assert r.status_code == 200, r.text
        return dict(r.json())

    def report(self, user: str) -> dict[str, Any]:
        return dict(self.use(user)["servers"].get("") or {})

    def notice(self, user: str) -> str | None:
        r = self.client.get(f"{self.url}user/{user}/api/contents/{NOTICE}")
        return str(r.json()["content"]) if r.status_code == 200 else None


def home_page(url: str, user: str) -> str:
    """The hub's home page as ``user`` sees it after logging in (dummy logins)."""
    with httpx.Client(base_url=url, timeout=60) as client:
        page = client.get("hub/login")
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page.text)
        assert xsrf, page.text[:2000]
        r = client.post("hub/login", data={"username": user, "password": "x",
                                           "_xsrf": xsrf.group(1)})
        assert r.status_code == 302, r.status_code  # not followed: it would start a server
        return client.get("hub/home").text


def test_idle_gpu_server_warned_then_stopped_and_the_others_kept(
    hub: TunerHub, standin: StandIn
) -> None:
    api = Hub(hub)
    api.client.post("users", json={"usernames": [p for p in PEOPLE if p != "dan"]})
    for person in PEOPLE:
        api.start(person)
    token = api.client.post("users/cat/tokens", json={"note": "t"}).json()["token"]
    IOLoop.current().run_sync(lambda: _run_busy_cell(hub.url, "cat", token))

    # Each server reports its own GPU (CUDA_VISIBLE_DEVICES as the spawner set it).
    def gpu_of(person: str) -> str:
        readings = api.report(person).get("readings") or []
        return str(readings[0]["gpu"]) if readings and readings[0]["utilization"] else ""

    gpus: dict[str, str] = {}
    for person in PEOPLE:
        gpus[person] = wait_for(functools.partial(gpu_of, person), timeout=60,
                                what=f"{person}'s GPU report")
    assert sorted(gpus.values()) == sorted(str(i) for i in range(len(PEOPLE))), gpus
    figures = {gpus["ann"]: idle_gpu(), gpus["bob"]: {**idle_gpu(), "pids": [os.getpid()]},
               gpus["cat"]: idle_gpu(), gpus["dan"]: idle_gpu(),
               gpus["eve"]: {**idle_gpu(), "error": GPU_IS_LOST}}

    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            # ann and cat each in JupyterLab, its tunehub extension polling their server.
            labs = {person: open_lab(browser, hub.url, person, gpus[person])
                    for person in ("ann", "cat")}
            standin.set(*[figures[str(i)] for i in range(len(PEOPLE))])
            # Warned inside JupyterLab: a warning notification in the page...
            for lab in labs.values():
                lab.get_by_text("GPUs unused for", exact=False).first.wait_for(
                    timeout=(WARN + 60) * 1000)
            # ... and the notice in the file browser (cat's stays while her cell runs).
            assert "GPUs have not been used" in wait_for(
                lambda: api.notice("cat") or "", timeout=60, what="cat's notice")
            ann_stopped_the_others_kept(api, hub)
            # cat's GPU used again: the notification goes away, so does the notice.
            standin.set(*[{**figures[str(i)], **(busy_gpu() if str(i) == gpus["cat"] else {})}
                          for i in range(len(PEOPLE))])
            labs["cat"].get_by_text("GPUs unused for", exact=False).first.wait_for(
                state="detached", timeout=60_000)
            wait_for(lambda: api.notice("cat") is None, timeout=60, what="cat's notice gone")
        finally:
            browser.close()

    # Reports of stopped servers are not kept: ann's (reclaimed), bob's (stopped by an admin).
    assert api.use("ann")["servers"] == {}
    assert api.client.delete("users/bob/server").status_code in (202, 204)
    wait_for(lambda: api.server("bob") is None, timeout=120, what="bob's server to stop")
    assert api.use("bob")["servers"] == {}

    # The reason outlives a hub restart (kept in the hub's state directory, root-only).
    reasons = hub.home / "state" / gpu_reclaim_reasons.FILE
    assert reasons.stat().st_mode & 0o777 == 0o600 and "ann" in json.loads(reasons.read_text())
    hub.restart()
    page = home_page(hub.url, "ann")
    assert 'id="tunehub-stop-reason"' in page and "give its GPUs back" in page, page[-3000:]
    assert "give its GPUs back" in api.use("ann")["stopped"]["reason"]


def open_lab(browser: Any, url: str, person: str, gpu: str) -> Any:
    """``person``'s JupyterLab page, once its tunehub extension has read the reclaim status."""
    page = browser.new_context().new_page()
    login(page, url, person, "x")
    with page.expect_response(lambda r: "tunehub/gpu-reclaim" in r.url,
                              timeout=180_000) as status:
        page.goto(f"{url}user/{person}/lab")
    assert status.value.ok and status.value.json()["gpus"] == [gpu], status.value.text()
    return page


def ann_stopped_the_others_kept(api: Hub, hub: TunerHub) -> None:
    """ann stopped, the reason on her home page; the others kept; bad reports refused."""
    wait_for(lambda: api.server("ann") is None, timeout=RECLAIM + 60,
             what="ann's idle GPU server to be stopped")
    page = home_page(hub.url, "ann")
    assert 'id="tunehub-stop-reason"' in page and "give its GPUs back" in page, page[-3000:]
    assert "not used for" in page
    metrics = api.client.get(f"{hub.url}hub/metrics").text
    assert "tunehub_gpu_servers_reclaimed_total 1.0" in metrics

    # cat: due as well, but a cell runs: warned, never stopped.
    wait_for(lambda: api.report("cat").get("state") == "cell running", timeout=60,
             what="cat's server to be held by its running cell")
    assert (api.server("cat") or {}).get("ready") and api.notice("cat")
    # bob: a process on his GPU is use; dan: exempt; eve: a lost GPU is a reason, no figure.
    assert api.report("bob")["state"] == "in use" and api.notice("bob") is None
    assert api.report("dan")["state"] == "not reclaimed" and api.notice("dan") is None
    assert api.use("dan")["policy"]["exempt"] is True
    eve = api.report("eve")
    assert eve["state"] == "unmeasured" and eve["readings"][0]["absent"] == LOST, eve
    assert "GPU lost" in eve["note"]
    for person in ("bob", "cat", "dan", "eve"):
        assert (api.server(person) or {}).get("ready"), f"{person}'s server was stopped"
    # Someone else's report is not ann's to send, nor to read.
    ann = api.client.post("users/ann/tokens", json={"note": "t"}).json()["token"]
    other = httpx.post(f"{hub.url}hub/api/tunehub/gpu-use/bob", json={"reclaim": True},
                       headers={"Authorization": f"token {ann}"}, timeout=30)
    assert other.status_code in (403, 404), other.text
    assert (api.server("bob") or {}).get("ready")

    # Bad reports: a 400 naming the field, never a 500.
    for body, field in (([], "body"), ({"readings": "x"}, "readings"),
                        ({"reclaim": "yes"}, "reclaim"), ({"server": "nope"}, "server"),
                        ({"note": "x" * 100_000}, "body")):
        r = api.client.post("tunehub/gpu-use/bob", json=body)
        assert r.status_code == 400 and field in r.json()["message"], (body, r.text)


def test_the_idle_clock() -> None:
    """Unused for the warning time: warn; then the further time: reclaim unless a cell runs;
    any use, or a GPU without figures, starts the clock again."""
    policy = Policy(warn_after=10, reclaim_after=5, enabled=True)
    idle = [GpuReading("0", utilization=0.01, memory_used_bytes=0)]
    clock = IdleClock()
    assert [clock.step(idle, t, False, policy) for t in (0, 9, 10, 14)] == [
        "idle", "idle", "warn", "warned"]
    assert clock.step(idle, 15, True, policy) == "cell running"
    assert clock.step(idle, 16, False, policy) == "reclaim"
    lost = [GpuReading("0", absent=LOST)]
    assert clock.step(lost, 17, False, policy) == "unmeasured" and clock.idle_since is None
    assert clock.step([GpuReading("0", utilization=0.0, pids=(7,))], 18, False,
                      policy) == "in use"
    assert clock.step(idle, 19, False, Policy(warn_after=1, enabled=False)) == "not reclaimed"
    assert own_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}) == ["2", "3"]
    assert own_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert own_gpus({"NVIDIA_VISIBLE_DEVICES": "GPU-abc"}) is None  # a pod: NVML's own
    assert own_gpus({}) == []
    # JupyterLab's toast shows 140 characters of a notification.
    assert len(lab_message(Policy(warn_after=1800, reclaim_after=900))) <= 140


def test_tunehub_up_servers_report_over_internal_tls_and_no_nvml_is_a_reason(
    platform: Platform,
) -> None:
    """The production wiring (``tunehub up``: internal TLS, a Unix user per person as root): a
    GPU server with no NVML library reports that reason to the hub and keeps running."""
    platform.env.update({"TUNEHUB_LOCAL_GPUS": "0", "TUNEHUB_GPU_SAMPLE_SECONDS": "1",
                         "TUNEHUB_GPU_RECLAIM_WARN_SECONDS": "1",
                         "TUNEHUB_GPU_RECLAIM_AFTER_SECONDS": "1"})
    platform.start()
    assert platform.password, platform.output
    hub = HubApi(platform.url, login_token(platform.url, "admin", platform.password))
    hub.call("POST", "hub/api/users/fay", 201)
    hub.start_server("fay", "gpu-1")
    def readings() -> list[dict[str, Any]]:
        use = hub.call("GET", "hub/api/tunehub/gpu-use/fay", 200)
        return list((use["servers"].get("") or {}).get("readings") or [])

    report = wait_for(readings, timeout=90, what="fay's server's GPU report")
    assert report[0]["gpu"] == "0" and report[0]["absent"] == NO_LIBRARY, report
    use = hub.call("GET", "hub/api/tunehub/gpu-use/fay", 200)
    assert use["servers"][""]["state"] == "unmeasured" and use["policy"]["warn_after"] == 1
    assert (hub.server("fay") or {}).get("ready"), "a server without NVML was stopped"


def test_stop_reasons_kept_on_disk_never_through_a_link(tmp_path: Path) -> None:
    """Kept across instances (a restart); a link planted in place of the file is neither
    followed on reading nor written through; a damaged file reads as empty."""
    StopReasons(tmp_path).keep("ann", "idle GPUs", 1.0)
    again = StopReasons(tmp_path)
    stopped = again.get("ann")
    assert stopped is not None and stopped.reason == "idle GPUs"
    again.forget("ann")
    assert StopReasons(tmp_path).get("ann") is None

    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"ann": {"reason": "planted", "at": 1}}))
    reasons = tmp_path / gpu_reclaim_reasons.FILE
    reasons.unlink()
    reasons.symlink_to(target)
    linked = StopReasons(tmp_path)
    assert linked.get("ann") is None  # ELOOP: never read through the link
    linked.keep("bob", "idle", 2.0)  # replaces the link itself, never writes through it
    assert not reasons.is_symlink() and "planted" in target.read_text()
    reasons.write_text("{not json")
    assert StopReasons(tmp_path).get("bob") is None
