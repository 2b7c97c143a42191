"""Bounded attempts and people (#31 item 6), attacked on a real ``tunehub up`` as root where
each person's trials run as their own Unix user on the local backend.

Per attempt: a trial past its ``resources.memory`` is killed by the kernel and fails saying
memory (warm and cold starts); a fork bomb stops at the attempt's process cap; a trial runs
in its attempt's own cgroup, and what it leaves running (a ``setsid`` child, a double fork) is
dead, by pid, once its trial has ended or been cancelled.
Per person: a spec over a cap is a 400 naming the field and the cap (on the Kubernetes backend
too); one person's attempts never exceed their concurrency cap while another's still start,
and theirs wait instead of failing.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest

from tests.polling import wait_for
from tests.security._attempt_limits_fixtures import (
    CAPS,
    LimitsWorld,
    limits_world,
    process_gone,
)

pytestmark = [pytest.mark.slow]
__all__ = ["limits_world"]  # the module's fixture, used by every test here

START_TICKS = """
def start_ticks(pid):
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[19])
"""

GREEDY = """\
import tuner
block = bytearray(1 << 30)  # 1 GiB, every page touched: the limit is 100Mi
for i in range(0, len(block), 4096):
    block[i] = 1
tuner.report(1.0)
"""

FORK_BOMB = START_TICKS + """
import json, os, pathlib, time, tuner
children, error = [], None
for _ in range(1000):
    try:
        pid = os.fork()
    except OSError as exc:
        error = exc.errno
        break
    if pid == 0:
        time.sleep(1000)
        os._exit(0)
    children.append(pid)
pathlib.Path(os.environ["RECORD"]).write_text(json.dumps(
    {"forked": len(children), "errno": error,
     "children": [[pid, start_ticks(pid)] for pid in children]}))
tuner.report(1.0)
"""

LEAVES_SLEEPERS = START_TICKS + """
import json, os, pathlib, subprocess, time, tuner
# One child in a session of its own (setsid: out of the attempt's process group)...
setsid = subprocess.Popen(["sleep", "1000"], start_new_session=True).pid
# ...and one double-forked, its parent gone, in another session.
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.write(w, str(os.getpid()).encode())
        time.sleep(1000)
    os._exit(0)
os.close(w)
double = int(os.read(r, 32))
os.wait()
pathlib.Path(os.environ["RECORD"]).write_text(json.dumps(
    {"sleepers": [[pid, start_ticks(pid)] for pid in (setsid, double)],
     "cgroups": open("/proc/self/cgroup").read().splitlines(),
     "trial_id": os.environ["TUNEHUB_TRIAL_ID"]}))
if os.environ.get("HANG"):
    time.sleep(1000)  # until cancelled
tuner.report(1.0)
"""

GATED = """\
import os, pathlib, time, tuner
record = pathlib.Path(os.environ["RECORD"])
me = os.environ["WHO"] + "-" + os.environ["TUNEHUB_TRIAL_ID"]
(record / (me + ".start")).write_text(repr(time.time()))
gate = pathlib.Path(os.environ["GATE"])
while not gate.exists():
    time.sleep(0.05)  # the trial's own wait for the test's gate
(record / (me + ".end")).write_text(repr(time.time()))
tuner.report(1.0)
"""


def _trial(world: LimitsWorld, sweep: int) -> dict[str, Any]:
    trials = world.alice.trials(sweep)
    assert len(trials) == 1, trials
    return trials[0]


def test_spec_over_a_cap_is_a_400_naming_the_field_and_the_cap(
        limits_world: LimitsWorld) -> None:
    alice = limits_world.alice
    for spec, field, cap in (
        ({"trials": 2147483647, "parallelism": 10000}, "trials", CAPS["TUNEHUB_MAX_TRIALS"]),
        ({"trials": 50, "parallelism": 9}, "parallelism", CAPS["TUNEHUB_MAX_PARALLELISM"]),
        ({"resources": {"workers": 3}}, "resources.workers",
         CAPS["TUNEHUB_MAX_WORKERS_PER_PERSON"]),
    ):
        r = alice.submit(GREEDY, "over-cap", **spec)
        assert r.status_code == 400, (spec, r.text)
        body = r.json()
        assert body["field"] == field, body
        assert f"the cap is {cap}" in body["error"], body
    assert all(s["name"] != "over-cap" for s in alice.http.get("sweeps").json())


def test_kubernetes_backend_refuses_the_same_caps(kube: Any, tmp_path: Path) -> None:
    from tests.sweeps_helpers import kube_cli_home, write_sweep

    home = kube_cli_home(kube, tmp_path, **CAPS)
    spec = write_sweep(tmp_path / "code", "import tuner\ntuner.report(1.0)\n",
                       trials=2147483647, parallelism=10000)
    run = home.cli("sweep", "run", str(spec), "--backend", "kubernetes")
    assert run.returncode != 0
    assert "trials" in run.stderr and "the cap is 50 (TUNEHUB_MAX_TRIALS)" in run.stderr, (
        run.stdout + run.stderr)
    assert "[]" in home.cli("sweep", "list", "--json", check=True).stdout
    assert kube.objects("jobs") == []


@pytest.mark.parametrize("start", ["warm", "cold"])
def test_a_trial_past_its_memory_is_killed_and_fails_saying_memory(
        limits_world: LimitsWorld, start: str) -> None:
    alice = limits_world.alice
    name = f"greedy-{start}"
    # A command with shell syntax cannot be forked warm: it starts cold, through sh.
    command = f"python {name}.py" if start == "warm" else f"python {name}.py && true"
    sweep = alice.run(GREEDY, name, command=command, resources={"memory": "100Mi"})
    assert alice.finished(sweep)["state"] in ("failed", "completed")
    trial = _trial(limits_world, sweep)
    assert trial["state"] == "failed", trial
    assert "memory" in trial["reason"] and "100Mi" in trial["reason"], trial


def test_a_fork_bomb_stops_at_the_attempt_process_cap_and_dies_with_it(
        limits_world: LimitsWorld) -> None:
    record = limits_world.shared / "fork-bomb.json"
    alice = limits_world.alice
    sweep = alice.run(FORK_BOMB, "fork-bomb", env={"RECORD": str(record)})
    view = alice.finished(sweep)
    assert view["state"] == "completed", (view, alice.log(sweep))
    seen = json.loads(record.read_text())
    assert seen["errno"] == errno.EAGAIN, seen  # fork refused by the pids controller
    assert 0 < seen["forked"] < int(CAPS["TUNEHUB_ATTEMPT_PIDS"]), seen
    assert all(process_gone(pid, ticks) for pid, ticks in seen["children"]), seen


def test_nothing_a_trial_started_outlives_it(limits_world: LimitsWorld) -> None:
    record = limits_world.shared / "sleepers.json"
    alice = limits_world.alice
    sweep = alice.run(LEAVES_SLEEPERS, "sleepers", env={"RECORD": str(record)})
    view = alice.finished(sweep)
    assert view["state"] == "completed", (view, alice.log(sweep))
    seen = json.loads(record.read_text())
    assert len(seen["sleepers"]) == 2
    # The trial is finished only once its cgroup is emptied: no wait beyond its end.
    still = [pid for pid, ticks in seen["sleepers"] if not process_gone(pid, ticks)]
    assert still == [], f"outlived their trial: {still}"
    # It ran in its attempt's own group, in each controller's hierarchy.
    # It ran in its attempt's own group: in each v1 controller's hierarchy, or on v2.
    lines = [c for c in seen["cgroups"]
             if {"memory", "cpu", "pids"} & set(c.split(":")[1].split(","))]
    assert len(lines) == 3 or not lines, seen["cgroups"]
    for line in lines or [c for c in seen["cgroups"] if c.startswith("0::")]:
        assert "/tunehub-" in line and f"/t{seen['trial_id']}-a1-" in line, seen["cgroups"]


def test_a_cancelled_trial_takes_what_it_started_with_it(limits_world: LimitsWorld) -> None:
    record = limits_world.shared / "cancelled-sleepers.json"
    alice = limits_world.alice
    sweep = alice.run(LEAVES_SLEEPERS, "cancelled", env={"RECORD": str(record), "HANG": "1"})
    wait_for(record.exists, timeout=180, what="the trial to start its sleepers")
    assert alice.http.post(f"sweeps/{sweep}/cancel").status_code == 200
    assert alice.finished(sweep)["state"] == "cancelled"
    sleepers = json.loads(record.read_text())["sleepers"]
    still = [pid for pid, ticks in sleepers if not process_gone(pid, ticks)]
    assert still == [], f"outlived their cancelled trial: {still}"


def test_one_person_never_runs_more_than_the_cap_while_others_still_start(
        limits_world: LimitsWorld) -> None:
    alice, bob = limits_world.alice, limits_world.bob
    record = limits_world.shared / "concurrency"
    record.mkdir()
    record.chmod(0o1777)
    gates = {who: limits_world.shared / f"gate-{who}" for who in ("alice", "bob")}
    cap = int(CAPS["TUNEHUB_MAX_WORKERS_PER_PERSON"])

    def env(who: str) -> dict[str, str]:
        return {"RECORD": str(record), "GATE": str(gates[who]), "WHO": who}

    def started(who: str) -> list[Path]:
        return sorted(record.glob(f"{who}-*.start"))

    # Alice asks for 5 at once over two sweeps; the cap lets 2 of them run.
    mine = [alice.run(GATED, "wide", trials=3, parallelism=3, env=env("alice")),
            alice.run(GATED, "wider", trials=2, parallelism=2, env=env("alice"))]
    wait_for(lambda: len(started("alice")) >= cap, timeout=180, what="alice's first trials")
    # Bob's trial starts while alice's hold her whole budget.
    theirs = bob.run(GATED, "bobs", env=env("bob"))
    wait_for(lambda: started("bob"), timeout=180, what="bob's trial to start")
    assert len(started("alice")) == cap, (started("alice"), [alice.trials(s) for s in mine])
    running = [t for s in mine for t in alice.trials(s) if t["state"] == "running"]
    assert len(running) == cap, running

    def told_why() -> list[dict[str, Any]]:  # queued, and saying so, not failed
        return [t for s in mine for t in alice.trials(s) if t["state"] == "pending"
                and "TUNEHUB_MAX_WORKERS_PER_PERSON" in (t["reason"] or "")]
    wait_for(told_why, timeout=60, what="alice's next trial to say why it waits")
    for gate in gates.values():
        gate.touch()
    for sweep in mine:
        assert alice.finished(sweep)["state"] == "completed"  # waited, never failed
    assert bob.finished(theirs)["state"] == "completed"
    done = [t for s in mine for t in alice.trials(s)]
    assert [(t["state"], t["reason"]) for t in done] == [("completed", None)] * 5, done
    spans = [(float(p.read_text()), float(p.with_suffix(".end").read_text()))
             for p in started("alice")]
    assert len(spans) == 5
    most = max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans)
    assert most <= cap, f"{most} of alice's trials ran at once: {sorted(spans)}"

