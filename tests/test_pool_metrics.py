"""The GPU pool's queue and shares in the tuner's Prometheus metrics, and a waiting trial's
place in line in ``sweep show`` and the trials API (issues 25 and 26).

One real hub and tuner service with one GPU id as a lock file (``TUNEHUB_LOCAL_GPUS=0``, no
CUDA needed), real trial processes of two people, a shares file naming a third with a cap."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.polling import wait_for
from tests.service_fixtures import running_tuner_hub
from tests.sweeps_helpers import write_sweep

# Each trial reports a step every half second until GO_FILE exists, then ends.
TRAIN = """
import os, time
import tuner

step = 0
while not os.path.exists(os.environ["GO_FILE"]):
    step += 1
    tuner.report(float(step), step=step)
    time.sleep(0.5)
tuner.report(float(step))
"""

SUBMIT = ["custom:tuner:read", "custom:tuner:submit", "access:services!service=tuner"]


def _metric(text: str, name: str, **labels: str) -> float | None:
    """The value of ``name{labels}`` in a Prometheus text page, or None when absent."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    match = re.search(rf"^{re.escape(name)}\{{{re.escape(want)}\}} (\S+)$", text, re.M)
    return float(match.group(1)) if match else None


def _trial_row(hub_url: str, user: str, sweep_id: int, number: int) -> str:
    """The text of trial ``number``'s row on the sweeps page, sweep ``sweep_id`` selected."""
    from tests.test_hub_browser import sweeps_page

    with sweeps_page(hub_url, user) as page:
        page.locator("#sweeps tbody tr").first.wait_for(timeout=120_000)
        page.goto(f"{hub_url}services/tuner/#sweep={sweep_id}")
        row = page.locator(f'#trials tbody tr[data-trial="{number}"]')
        row.wait_for(timeout=120_000)
        return str(row.inner_text()).strip()


def _finished(state: Callable[[httpx.Client, int], str], client: httpx.Client,
              sweep_id: int) -> bool:
    return state(client, sweep_id) in ("completed", "failed")


def test_the_queue_and_shares_are_metrics_and_a_waiting_trial_says_its_place(
    tmp_path: Path,
) -> None:
    shares = tmp_path / "shares.yaml"
    shares.write_text(yaml.safe_dump({"people": {"carl": {"max_gpus": 2, "weight": 2}}}))
    with running_tuner_hub(
        tmp_path, f"sqlite:///{tmp_path / 'tunehub.sqlite'}",
        extra_env={"TUNEHUB_LOCAL_GPUS": "0", "TUNEHUB_POOL_SHARES": str(shares)},
        extra_config='c.JupyterHub.services[1]["oauth_no_confirm"] = True\n',
    ) as hub:
        ana_token = hub.token("ana", SUBMIT)
        ana, bob = hub.client(ana_token), hub.client(hub.token("bob", SUBMIT))
        go = hub.data / "go"

        def submit(client: httpx.Client, name: str, **spec: Any) -> int:
            path = write_sweep(hub.data / name, TRAIN, pruner="none", resources={"gpu": 1},
                               trial_timeout="10m", max_retries=0, env={"GO_FILE": str(go)},
                               **spec)
            body = yaml.safe_load(path.read_text())
            body["code"] = str(path.parent)
            r = client.post("sweeps", json={"spec": body})
            assert r.status_code == 201, r.text
            return int(r.json()["id"])

        def trials(client: httpx.Client, sweep_id: int) -> dict[int, dict[str, Any]]:
            return {t["number"]: t for t in client.get(f"sweeps/{sweep_id}/trials").json()}

        # Ana's two-trial sweep on the one GPU: trial 0 runs, trial 1 waits first in line.
        a = submit(ana, "a", trials=2, parallelism=2)
        wait_for(lambda: (trials(ana, a).get(0) or {}).get("last_step"), timeout=240,
                 what="ana's trial 0 to run")
        first = "waiting for a GPU: 1st in line, for the next GPU freed"
        wait_for(lambda: (trials(ana, a).get(1) or {}).get("reason") == first, timeout=60,
                 what="ana's trial 1 to wait first in line")
        assert trials(ana, a)[1]["state"] == "pending"

        # Bob holds nothing: the fair share puts his trial ahead of ana's second one.
        b = submit(bob, "b", trials=1, parallelism=1)
        behind = f"waiting for a GPU: 2nd in line behind bob's trial 0 of sweep {b}"
        wait_for(lambda: trials(ana, a)[1]["reason"] == behind, timeout=120,
                 what=f"ana's trial 1 to say {behind!r} (says {trials(ana, a)[1]['reason']!r})")
        assert trials(bob, b)[0]["reason"] == ("waiting for a GPU: 1st in line, for the next "
                                               "GPU freed")
        assert trials(ana, a)[0]["reason"] is None  # the running trial says nothing
        pool = ana.get("pool").json()
        assert [(q["person"], q["what"]) for q in pool["queue"]] == [
            ("bob", f"sweep {b} trial 0"), ("ana", f"sweep {a} trial 1")]

        # sweep show, text and --json, from ana's notebook terminal.
        env = {**os.environ, "TUNEHUB_API_URL": f"{hub.url}services/tuner/",
               "TUNEHUB_TOKEN": ana_token, "COLUMNS": "200"}
        tunehub = str(Path(sys.executable).parent / "tunehub")
        text = subprocess.run([tunehub, "sweep", "show", str(a)], capture_output=True,
                              text=True, timeout=120, env=env)
        assert text.returncode == 0, text.stderr
        assert f"trial 1 pending: {behind}" in text.stdout, text.stdout
        shown = subprocess.run([tunehub, "sweep", "show", str(a), "--json"],
                               capture_output=True, text=True, timeout=120, env=env)
        assert shown.returncode == 0, shown.stderr
        detail = {t["number"]: t for t in json.loads(shown.stdout)["trials_detail"]}
        assert detail[1]["reason"] == behind

        # The sweeps page's trial row says the same, in Chromium, signed in as ana.
        assert _trial_row(hub.url, "ana", a, 1).endswith(behind)

        # The scrape (with the hub's metrics scope) shows the line and everyone's share.
        scrape = httpx.get(f"{hub.url}services/tuner/metrics", timeout=30,
                           headers={"Authorization": f"token {hub.admin_token}"})
        assert scrape.status_code == 200
        page = scrape.text
        assert _metric(page, "tunehub_gpu_queue_length", kind="trial") == 2.0, page
        assert _metric(page, "tunehub_gpu_queue_length", kind="notebook") == 0.0
        assert _metric(page, "tunehub_gpu_queue_gpus", kind="trial") == 2.0
        assert (_metric(page, "tunehub_gpu_queue_oldest_wait_seconds", kind="trial") or 0) > 0
        assert _metric(page, "tunehub_gpu_person_held_gpus", person="ana") == 1.0
        assert _metric(page, "tunehub_gpu_person_held_gpus", person="bob") == 0.0
        # Ana and bob (weight 1 each) present, carl (weight 2) named: ana's fair share of the
        # one GPU is half of it, and she holds it all.
        fair = {row["person"]: row["fair_share_gpus"] for row in pool["shares"]}
        assert _metric(page, "tunehub_gpu_fair_share_gpus", person="ana") == fair["ana"]
        assert _metric(page, "tunehub_gpu_share_ratio", person="ana") == 1.0 / fair["ana"]
        assert _metric(page, "tunehub_gpu_share_ratio", person="bob") == 0.0
        assert _metric(page, "tunehub_gpu_cap_gpus", person="carl") == 2.0
        assert _metric(page, "tunehub_gpu_cap_gpus", person="ana") is None  # no cap, no series
        # Without the scope, nothing.
        assert httpx.get(f"{hub.url}services/tuner/metrics", timeout=30).status_code in (401,
                                                                                         403)

        # Everyone finishes; the line empties and the scrape says so.
        go.write_text("go")
        def state(client: httpx.Client, sweep_id: int) -> str:
            return str(client.get(f"sweeps/{sweep_id}").json()["state"])

        for client, sweep_id in ((bob, b), (ana, a)):
            wait_for(partial(_finished, state, client, sweep_id), timeout=300,
                     what=f"sweep {sweep_id}")
            assert state(client, sweep_id) == "completed"
        page = httpx.get(f"{hub.url}services/tuner/metrics", timeout=30,
                         headers={"Authorization": f"token {hub.admin_token}"}).text
        assert _metric(page, "tunehub_gpu_queue_length", kind="trial") == 0.0
        assert _metric(page, "tunehub_gpu_queue_oldest_wait_seconds", kind="trial") == 0.0
