"""A controller killed with SIGKILL mid-sweep: resume finishes the sweep with exactly
``trials`` trials, no duplicates, nothing completed lost."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import optuna
from sqlalchemy import select, text

from tests.conftest import Home
from tests.polling import wait_for
from tests.sweeps_helpers import parse_json, write_sweep
from tunehub_base.process_identity import ProcessIdentity, parse_records
from tuner.db import Database, SweepRow, Trial

SLOW = """
import time, tuner
p = tuner.params()
for step in range(1, 5):
    time.sleep(0.25)  # the workload: a slow epoch
    tuner.report(p["x"] + step, step=step)
"""


def _ended(process: ProcessIdentity) -> bool:
    """The recorded process no longer runs: judged by its start time, so a stranger that took
    its pid since (pids wrap on a busy machine) does not keep it alive. A record without a
    start time is a worker that had ended before its pid file was written."""
    return process.alive() is not True


def test_sigkill_then_resume_finishes_exactly(home: Home, tmp_path: Path) -> None:
    spec = write_sweep(tmp_path / "code", SLOW, trials=8, parallelism=2, max_retries=0)
    submitted = parse_json(home.cli("sweep", "run", str(spec), "--json", check=True).stdout)
    sweep_id, controller = submitted["id"], ProcessIdentity.of(submitted["controller_pid"])
    db = Database(home.db_url)

    def trials() -> list[Trial]:
        with db.session() as s:
            return list(s.scalars(select(Trial).where(Trial.sweep_id == sweep_id)))

    # Kill while some trials are done and others are running.
    wait_for(
        lambda: sum(t.state == "completed" for t in trials()) >= 2
        and any(t.state == "running" for t in trials()),
        what="two completed trials and one running",
    )
    os.kill(controller.pid, signal.SIGKILL)
    wait_for(lambda: _ended(controller), what="controller to die")
    before = {t.number: t.value for t in trials() if t.state == "completed"}
    attempts = [process for p in (home.path / "sweeps" / str(sweep_id)).rglob("attempt-*.pid")
                for process in parse_records(p.read_text())]
    # Trials die with their controller instead of reporting into the void.
    wait_for(lambda: all(_ended(p) for p in attempts), what="trials to die")
    # The kill can land inside Optuna's ask: a trial created, its parameters not yet written
    # and no row of ours. Make that happen for sure: the resumed sweep must run it with a
    # full set of parameters under its number.
    with db.session() as s:
        study_name = s.get(SweepRow, sweep_id).study_name  # type: ignore[union-attr]
    orphan = optuna.load_study(study_name=study_name, storage=home.db_url).ask()
    assert orphan.number < 8 and not orphan.params
    # It can also land between our recording a result and telling Optuna: a trial finished
    # for us and still running for Optuna. Resume tells Optuna (and keeps the value).
    untold = min(before)
    with db.engine.begin() as conn:
        conn.execute(text(
            "UPDATE trials SET state = 'RUNNING', datetime_complete = NULL "
            "WHERE number = :n AND study_id = "
            "(SELECT study_id FROM studies WHERE study_name = :s)"
        ), {"n": untold, "s": study_name})

    resumed = home.cli("sweep", "resume", str(sweep_id), "--wait", "--json")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    out = parse_json(resumed.stdout)
    assert out["state"] == "completed", (out, resumed.stderr)
    numbers = [t["number"] for t in out["trials_detail"]]
    assert sorted(numbers) == list(range(8)), numbers
    states = {t["number"]: (t["state"], t.get("reason")) for t in out["trials_detail"]}
    logs = {n: (home.path / "sweeps" / str(sweep_id) / "trials" / str(n) / "trial.log")
            for n, (state, _) in states.items() if state != "completed"}
    assert not logs, (states, {n: p.read_text()[-2000:] for n, p in logs.items() if p.exists()})
    after = {t["number"]: t["value"] for t in out["trials_detail"]}
    for number, value in before.items():
        assert after[number] == value
    restarted = [t for t in out["trials_detail"] if t["attempts"] > 1]
    assert restarted, "the trials running at the kill were run again"
    with db.session() as s:
        sweep = s.get(SweepRow, sweep_id)
        assert sweep is not None
        study = optuna.load_study(study_name=sweep.study_name, storage=home.db_url)
    assert len(study.trials) == 8
    assert {t.state for t in study.trials} == {optuna.trial.TrialState.COMPLETE}
    assert out["completed"] == 8


def test_resume_refuses_finished_and_running_sweeps(sqlite_home: Home, tmp_path: Path) -> None:
    spec = write_sweep(tmp_path / "code", SLOW, trials=1, parallelism=1)
    out = parse_json(sqlite_home.cli("sweep", "run", str(spec), "--wait", "--json").stdout)
    proc = sqlite_home.cli("sweep", "resume", str(out["id"]), "--wait")
    assert proc.returncode == 2
    expected = f"tunehub: error: sweep {out['id']} is completed; nothing to resume"
    assert proc.stderr.strip() == expected


GATED = """
import pathlib, time, tuner
p = tuner.params()
while not pathlib.Path({gate!r}).exists():
    time.sleep(0.05)  # the workload: blocked until the test opens the gate
tuner.report(p["x"], step=1)
"""


def test_resume_finds_a_study_named_by_an_earlier_version(
    sqlite_home: Home, tmp_path: Path
) -> None:
    """Studies were once named ``tunehub-<hex>``; a sweep of that time resumes on its study
    (lookups read the sweep row's ``study_name``, never rebuild the name)."""
    gate = tmp_path / "gate"
    spec = write_sweep(tmp_path / "code", GATED.format(gate=str(gate)), trials=2, parallelism=1,
                       max_retries=0)
    submitted = parse_json(sqlite_home.cli("sweep", "run", str(spec), "--json", check=True).stdout)
    sweep_id, controller = submitted["id"], ProcessIdentity.of(submitted["controller_pid"])
    db = Database(sqlite_home.db_url)

    def running() -> bool:
        with db.session() as s:
            return s.scalar(select(Trial.id).where(Trial.sweep_id == sweep_id,
                                                   Trial.state == "running")) is not None

    wait_for(running, what="a trial to run")
    os.kill(controller.pid, signal.SIGKILL)
    wait_for(lambda: _ended(controller), what="controller to die")
    old_name = "tunehub-0123456789abcdef0123456789abcdef"
    with db.engine.begin() as conn:
        new_name = conn.execute(text("SELECT study_name FROM tunehub_sweeps WHERE id = :i"),
                                {"i": sweep_id}).scalar_one()
        conn.execute(text("UPDATE studies SET study_name = :old WHERE study_name = :new"),
                     {"old": old_name, "new": new_name})
        conn.execute(text("UPDATE tunehub_sweeps SET study_name = :old WHERE id = :i"),
                     {"old": old_name, "i": sweep_id})
    gate.touch()

    resumed = sqlite_home.cli("sweep", "resume", str(sweep_id), "--wait", "--json")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    out = parse_json(resumed.stdout)
    assert out["state"] == "completed" and out["completed"] == 2, out
    study = optuna.load_study(study_name=old_name, storage=sqlite_home.db_url)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 2
