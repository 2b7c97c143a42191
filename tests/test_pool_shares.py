"""Shares and caps as a setting, trials preempting trials, and checkpoint ages read from files
(issue 25, one machine).

The end-to-end test runs the real hub and tuner service with two GPU ids as lock files
(``TUNEHUB_LOCAL_GPUS=0,1``, no CUDA needed), real trial processes of two accounts, and a
shares file (``TUNEHUB_POOL_SHARES``) the test edits while the tuner runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.polling import wait_for
from tests.service_fixtures import TunerHub, running_tuner_hub
from tests.sweeps_helpers import write_sweep
from tunehub_base.pool import ShareConfig
from tunehub_base.pool.shares_setting import SharesSource, parse_shares
from tuner.scheduling.checkpoint_age import last_checkpoint_at

# --- the setting ------------------------------------------------------------------------------


def test_shares_inline_json_or_yaml() -> None:
    config = parse_shares('{"people": {"ana": {"weight": 2, "max_gpus": 1}}}')
    assert config.person("ana").max_gpus == 1 and config.person("ana").weight == 2.0
    assert config.person("bob").max_gpus is None  # the default: weight 1, no cap
    source = SharesSource('{"groups": {"vision": {"max_gpus": 3}}}')
    assert source.current().groups["vision"].max_gpus == 3 and source.error is None
    assert SharesSource("").current() == ShareConfig()


@pytest.mark.parametrize(("text", "named"), [
    ('{"people": {"ana": {"max_gpus": -1}}}', "people.ana.max_gpus"),
    ('{"people": {"ana": {"weight": 0}}}', "people.ana.weight"),
    ('{"teams": {}}', "'teams'"),
    ('{"people": [1]}', "people"),
    ("{people: [", "not JSON or YAML"),
])
def test_a_bad_inline_value_names_its_field_and_leaves_the_defaults(text: str, named: str) -> None:
    with pytest.raises(ValueError, match="TUNEHUB_POOL_SHARES") as raised:
        parse_shares(text)
    assert named in str(raised.value)
    source = SharesSource(text)
    assert source.current() == ShareConfig()
    assert source.error is not None and named in source.error


def test_a_shares_file_is_read_again_when_it_changes_and_a_bad_edit_keeps_the_last(
    tmp_path: Path,
) -> None:
    path = tmp_path / "shares.yaml"
    path.write_text("people:\n  ana: {max_gpus: 1}\n")
    source = SharesSource(str(path))
    assert source.current().person("ana").max_gpus == 1
    path.write_text("people:\n  ana: {max_gpus: 2, weight: 3}\n")
    assert source.current().person("ana").max_gpus == 2
    path.write_text("people:\n  ana: {max_gpus: two}\n")  # a typo: the last good one stays
    assert source.current().person("ana").max_gpus == 2
    assert source.error is not None and "people.ana.max_gpus" in source.error
    path.unlink()
    assert source.current().person("ana").max_gpus == 2 and "cannot read" in str(source.error)
    path.write_text("{}\n")
    assert source.current() == ShareConfig() and source.error is None


# --- checkpoint ages, never through a link ---------------------------------------------------


def test_checkpoint_age_is_the_newest_regular_file_and_follows_no_link(tmp_path: Path) -> None:
    directory = tmp_path / "checkpoints"
    assert last_checkpoint_at(directory) is None  # none yet
    directory.mkdir()
    assert last_checkpoint_at(directory) is None
    (directory / "checkpoint.pkl").write_bytes(b"x")
    os.utime(directory / "checkpoint.pkl", (1000.0, 1000.0))
    (directory / "older").write_bytes(b"x")
    os.utime(directory / "older", (500.0, 500.0))
    assert last_checkpoint_at(directory) == 1000.0
    # A link to a newer file elsewhere (a file only root may read, say) is not followed.
    elsewhere = tmp_path / "precious"
    elsewhere.write_text("root's")
    os.utime(elsewhere, (9000.0, 9000.0))
    (directory / "link").symlink_to(elsewhere)
    (directory / "sub").mkdir()
    os.utime(directory / "sub", (8000.0, 8000.0))
    assert last_checkpoint_at(directory) == 1000.0
    # The directory itself swapped for a link: nothing is read through it.
    moved = tmp_path / "moved"
    directory.rename(moved)
    directory.symlink_to(moved)
    assert last_checkpoint_at(directory) is None


# --- end to end: a cap, then a trial preempting a trial --------------------------------------

# Trial 0 checkpoints at every step; the others never do. Each trains a step every half second
# until GO_FILE exists, then two more steps, and ends with its step count. At SIGTERM it saves
# (if it checkpoints) and exits at once. A resumed attempt continues from its checkpoint.
TRAIN = """
import json, os, signal, sys, time
import tuner

p = tuner.params()
saves = os.environ["TUNEHUB_TRIAL_NUMBER"] == "0"
found = tuner.restore()
state, step = found if found else ({"steps": []}, 0)
attempt = os.environ["TUNEHUB_TRIAL_ATTEMPT"]

def stop(*_):
    if saves:
        tuner.checkpoint(state, step)
    print("SIGTERM at step", step, flush=True)
    sys.exit(0)

signal.signal(signal.SIGTERM, stop)
end = None
while end is None or step < end:
    if end is None and os.path.exists(os.environ["GO_FILE"]):
        end = step + 2
    step += 1
    state["steps"].append(attempt)
    tuner.report(p["x"] + step, step=step)
    if saves:
        tuner.checkpoint(state, step)
    time.sleep(0.5)
print("RECORD", json.dumps(state), flush=True)
tuner.report(float(step))
"""

SUBMIT = ["custom:tuner:read", "custom:tuner:submit", "access:services!service=tuner"]


@pytest.fixture
def shared_pool(tmp_path: Path) -> Iterator[tuple[TunerHub, Path]]:
    shares = tmp_path / "shares.yaml"
    shares.write_text(yaml.safe_dump({"people": {"ana": {"max_gpus": 1}},
                                      "groups": {"vision": {"weight": 2, "max_gpus": 1}}}))
    with running_tuner_hub(
        tmp_path, f"sqlite:///{tmp_path / 'tunehub.sqlite'}",
        extra_env={"TUNEHUB_LOCAL_GPUS": "0,1", "TUNEHUB_PREEMPT_GRACE_SECONDS": "60",
                   "TUNEHUB_POOL_SHARES": str(shares)},
        extra_config='c.JupyterHub.services[1]["oauth_no_confirm"] = True\n',
    ) as hub:
        yield hub, shares


def _pool_page(hub: TunerHub, user: str) -> tuple[list[str], list[str]]:
    """The sweeps page's "GPU pool" section in Chromium, signed in as ``user``: the rows of
    its queue and of its shares, as text, once the queue shows someone."""
    from tests.test_hub_browser import sweeps_page

    with sweeps_page(hub.url, user) as page:
        page.locator("#pool-queue tbody tr").first.wait_for(timeout=120_000)
        return ([r.inner_text() for r in page.locator("#pool-queue tbody tr").all()],
                [r.inner_text() for r in page.locator("#pool-shares tbody tr").all()])


def _submit(client: httpx.Client, hub: TunerHub, name: str, go: Path, **spec: Any) -> int:
    path = write_sweep(hub.data / name, TRAIN, pruner="none", direction="maximize",
                       resources={"gpu": 1}, trial_timeout="10m", max_retries=0,
                       env={"GO_FILE": str(go)}, **spec)
    body = yaml.safe_load(path.read_text())
    body["code"] = str(path.parent)
    r = client.post("sweeps", json={"spec": body})
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def test_a_cap_holds_a_trial_back_and_a_higher_priority_trial_preempts_the_cheapest(
    shared_pool: tuple[TunerHub, Path],
) -> None:
    hub, shares_file = shared_pool
    ana_token = hub.token("ana", SUBMIT)
    ana, bob = hub.client(ana_token), hub.client(hub.token("bob", SUBMIT))
    go = hub.data / "go"

    def trials(sweep_id: int) -> dict[int, dict[str, Any]]:
        return {t["number"]: t for t in ana.get(f"sweeps/{sweep_id}/trials").json()}

    # Bob is in the hub group vision, whose quota is 1 GPU: his trials count against it.
    admin = {"Authorization": f"token {hub.admin_token}"}
    for method, path, body in (("POST", "groups/vision", None),
                               ("POST", "groups/vision/users", {"users": ["bob"]})):
        r = httpx.request(method, f"{hub.url}hub/api/{path}", headers=admin, json=body,
                          timeout=30)
        assert r.status_code in (200, 201), r.text

    # Ana may hold one GPU: of her two-trial sweep, one runs, the other waits "over cap",
    # although the second GPU is free.
    a = _submit(ana, hub, "a", go, trials=2, parallelism=2, priority="low")
    wait_for(lambda: ((trials(a).get(0) or {}).get("last_step") or 0) >= 1, timeout=240,
             what="ana's trial 0 to run")
    capped = wait_for(lambda: (t := trials(a).get(1)) and t["state"] == "pending"
                      and "cap" in (t.get("reason") or "") and t, timeout=60,
                      what="ana's trial 1 to wait with its cap as the reason")
    assert capped["reason"] == "waiting for a GPU: over your cap of 1 GPUs"
    pool = ana.get("pool").json()
    assert pool["held"] == 1
    assert [(q["position"], q["person"], q["what"], q["reason"]) for q in pool["queue"]] == [
        (1, "ana", f"sweep {a} trial 1", "over your cap of 1 GPUs")]
    shares = {row["person"]: row for row in pool["shares"]}
    assert (shares["ana"]["max_gpus"], shares["ana"]["weight"], shares["ana"]["held_gpus"],
            shares["ana"]["waiting_gpus"]) == (1, 1.0, 1, 1)
    assert [{k: v for k, v in g.items() if k != "members"} for g in pool["groups"]] == [
        {"group": "vision", "weight": 2.0, "max_gpus": 1, "held_gpus": 0}]
    assert trials(a)[0]["state"] == "running" and trials(a)[1]["state"] == "pending"
    # tunehub pool from ana's notebook terminal shows the cap and the queue.
    cli = subprocess.run(
        [str(Path(sys.executable).parent / "tunehub"), "pool"], capture_output=True, text=True,
        timeout=120, env={**os.environ, "TUNEHUB_API_URL": f"{hub.url}services/tuner/",
                          "TUNEHUB_TOKEN": ana_token, "COLUMNS": "200"})
    assert cli.returncode == 0, cli.stderr
    assert "Shares" in cli.stdout and "over your cap of 1 GPUs" in cli.stdout, cli.stdout

    # The sweeps page's pool section says the same, to anyone signed in (bob here).
    queue_rows, share_rows = _pool_page(hub, "bob")
    assert [r.split("\t") for r in queue_rows] == [
        ["1", "ana", f"sweep {a} trial 1", "1", "low", "over your cap of 1 GPUs"]], queue_rows
    ana_row = next(r.split("\t") for r in share_rows if r.startswith("ana"))
    assert ana_row[:5] == ["ana", "person:ana", "1", "1", "1"], ana_row
    assert any(r.startswith("group vision") for r in share_rows), share_rows

    # The admin lifts the cap in the file: the tuner reads it again, trial 1 starts.
    shares_file.write_text(yaml.safe_dump({"people": {"ana": {"weight": 1}},
                                           "groups": {"vision": {"weight": 2, "max_gpus": 1}}}))
    wait_for(lambda: (trials(a)[1].get("last_step") or 0) >= 1, timeout=120,
             what="ana's trial 1 to start once her cap is lifted")
    assert trials(a)[1]["reason"] is None
    # Trial 0 checkpoints at every step; trial 1 never. Two of trial 0's steps after trial 1
    # began, trial 0's newest checkpoint is younger than trial 1's start: stopping trial 0
    # loses less, although it started first (the attempt's start would say the opposite).
    mark = trials(a)[0]["last_step"]
    wait_for(lambda: trials(a)[0]["last_step"] >= mark + 2, timeout=120,
             what="ana's trial 0 to checkpoint twice more")
    assert ana.get("pool").json()["held"] == 2

    # The tuner has read bob's membership from the hub (it reads the configured groups).
    wait_for(lambda: bob.get("pool").json()["groups"][0]["members"] == ["bob"], timeout=60,
             what="the pool to know vision's members")
    # Bob's normal-priority sweep on the full pool preempts one of ana's low-priority trials;
    # its second trial would preempt another, but vision's quota of 1 GPU holds it back.
    b = _submit(bob, hub, "b", go, trials=2, parallelism=2, priority="normal")
    stopped = wait_for(lambda: (t := trials(a)[0])["state"] == "pending" and t, timeout=180,
                       what="ana's trial 0 to be preempted for bob's trial")
    assert (stopped["attempts"], stopped["preemptions"]) == (1, 1)
    assert stopped["reason"].startswith("preempted"), stopped
    assert trials(a)[1]["state"] == "running"  # the one that would lose more runs on
    bob_trial = wait_for(
        lambda: (t := bob.get(f"sweeps/{b}/trials").json()) and t[0]["state"] == "running"
        and (t[0].get("last_step") or 0) >= 1 and t[0], timeout=180,
        what="bob's trial to run on the freed GPU")
    assert bob_trial["preemptions"] == 0
    expected = [("ana", f"sweep {a} trial 1 attempt 1"), ("bob", f"sweep {b} trial 0 attempt 1")]
    seen: list[Any] = []

    def holders() -> bool:
        # (A record is briefly unreadable while its holder rewrites its measured use.)
        pool = bob.get("pool").json()
        seen[:] = [pool["gpus"]]
        return sorted((str((g["holder"] or {}).get("person")), str((g["holder"] or {}).get(
            "what"))) for g in pool["gpus"]) == expected

    wait_for(holders, timeout=30, what=f"the GPUs to show {expected} (saw {seen})")
    pool = bob.get("pool").json()
    queue = {q["person"]: q for q in pool["queue"]}
    assert sorted(queue) == ["ana", "bob"] and len(pool["queue"]) == 2, pool
    assert queue["ana"]["what"] == f"sweep {a} trial 0"
    assert queue["bob"]["what"] in (f"sweep {b} trial 1", f"sweep {b} next trial"), pool
    assert queue["bob"]["reason"] == "over your group vision's cap of 1 GPUs", pool
    assert pool["groups"] == [{"group": "vision", "weight": 2.0, "max_gpus": 1,
                               "held_gpus": 1, "members": ["bob"]}]
    assert trials(a)[0]["state"] == "pending"  # it does not run beside them

    # Everyone finishes: ana's trial 0 resumes from its checkpoint, same number and params.
    go.write_text("go")
    for client, sweep_id in ((bob, b), (ana, a)):
        done = wait_for(lambda c=client, s=sweep_id: (v := c.get(f"sweeps/{s}").json())[
            "state"] in ("completed", "failed") and v, timeout=300, what=f"sweep {sweep_id}")
        assert done["state"] == "completed" and done["failed"] == 0, done
    final = trials(a)
    assert (final[0]["attempts"], final[0]["preemptions"]) == (2, 1)
    assert final[0]["params"] == stopped["params"]
    assert (final[1]["attempts"], final[1]["preemptions"]) == (1, 0)
    log = ana.get(f"sweeps/{a}/trials/0/logs").text
    record = json.loads(log.split("RECORD ", 1)[1].splitlines()[0])
    first = record["steps"].count("1")
    assert first >= 3 and record["steps"][first:].count("2") >= 2
    assert record["steps"] == ["1"] * first + ["2"] * (len(record["steps"]) - first)
    assert final[0]["value"] == pytest.approx(len(record["steps"]))  # continued, not redone
    assert ana.get("pool").json()["queue"] == []
    # Bob's trials' GPU-hours count for his team as well as for him (their holder records
    # carry his hub groups); ana's, in no configured group, for her alone.
    usage = bob.get("usage", params={"since": "2020-01-01"}).json()
    assert usage["person"]["bob"] > 0, usage
    assert usage["group"]["vision"] == pytest.approx(usage["person"]["bob"]), usage
    assert usage["person"]["ana"] > 0 and set(usage["group"]) == {"vision"}, usage
    metrics = httpx.get(f"{hub.url}services/tuner/metrics", timeout=30,
                        headers={"Authorization": f"token {hub.admin_token}"}).text
    assert "tunehub_trial_attempts_preempted_total 1.0" in metrics
