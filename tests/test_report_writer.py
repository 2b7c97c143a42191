"""Reports in group commits (:mod:`tuner.scheduling.report_writer`), on SQLite and PostgreSQL:
many trials' reports share a transaction, every report lands in order in tunehub's rows and in
Optuna's study, a bad report fails only itself, and an unreachable database fails the batch
as an outage (503 for the API, waited out by a caller that waits)."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import optuna
import pytest
from sqlalchemy import select

from tunehub_base.settings import load_settings
from tuner.backends.instant import InstantBackend, Outcome
from tuner.db import Database, Trial, TrialReport
from tuner.db.outage import DatabaseUnavailable
from tuner.errors import NotFound
from tuner.lifecycle.ledger import Ledger
from tuner.lifecycle.trial_paths import TrialPaths
from tuner.scheduling.report_writer import ReportRow, ReportWriter
from tuner.search.optuna_adapter import record_intermediate_values
from tuner.spec import SweepSpec
from tuner.sweep_store import Actor, SweepStore

TRIALS, STEPS = 12, 15


def _sweep(db: Database, url: str, tmp_path: Path) -> tuple[list[Trial], str]:
    """A sweep of ``TRIALS`` trials with their rows and Optuna trials; the study's name."""
    settings = load_settings({"TUNEHUB_HOME": str(tmp_path / "home"),
                              "TUNEHUB_DB_URL": url}).ensure_dirs()
    spec = SweepSpec.from_dict({
        "name": "reports", "command": "python -c pass", "metric": "m", "trials": TRIALS,
        "parallelism": TRIALS, "sampler": "random", "pruner": "none",
        "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
    })
    backend = InstantBackend(script=lambda launch, params: Outcome(hold=True))
    sweep = SweepStore(db, settings).submit(spec, Actor(name="ana", admin=False), backend)
    study = optuna.load_study(study_name=sweep.study_name, storage=url)
    ledger = Ledger(db)
    for number in range(TRIALS):
        asked = study.ask()
        work = tmp_path / f"w{number}"
        paths = TrialPaths(work, work / "trial.log", work / "artifacts")
        ledger.add_trial(sweep.id, number, asked._trial_id, {"x": 0.5}, paths)
    return ledger.trials(sweep.id), sweep.study_name


def test_many_trials_share_commits_and_nothing_is_lost_or_reordered(
    db_url: str, tmp_path: Path,
) -> None:
    db = Database(db_url)
    trials, study = _sweep(db, db_url, tmp_path)
    writer = ReportWriter(db)
    futures: list[Future[None]] = []
    # Every trial's reports in its own order, interleaved with the others' as they arrive
    # from many trials at once; queued while the writer is busy, they commit together.
    with writer._cond:  # the writer thread waits until every report is queued
        for step in range(1, STEPS + 1):
            for i, t in enumerate(trials):
                futures.append(writer.submit(ReportRow(t.id, step, i + step / 100,
                                                       t.optuna_trial_id)))
    for future in futures:
        future.result(timeout=60)
    writer.close()
    assert writer.written == TRIALS * STEPS
    assert writer.commits == 1, "the reports queued together were not committed together"
    with db.session() as s:
        rows = s.execute(select(TrialReport.trial_id, TrialReport.step, TrialReport.value)).all()
        latest = {t.id: (t.last_step, t.value) for t in s.scalars(select(Trial))}
    by_trial = {t.id: i for i, t in enumerate(trials)}
    assert sorted(rows) == sorted((t.id, step, i + step / 100) for i, t in enumerate(trials)
                                  for step in range(1, STEPS + 1))
    assert latest == {t.id: (STEPS, by_trial[t.id] + STEPS / 100) for t in trials}
    for i, frozen in enumerate(optuna.load_study(study_name=study,
                                                 storage=db_url).trials):
        assert frozen.intermediate_values == {step: i + step / 100
                                              for step in range(1, STEPS + 1)}


def test_a_step_reported_again_replaces_ours_and_optuna_keeps_the_first(
    db_url: str, tmp_path: Path,
) -> None:
    db = Database(db_url)
    trials, study = _sweep(db, db_url, tmp_path)
    t = trials[0]
    writer = ReportWriter(db)
    # Both in one batch, then once more in a batch of its own.
    with writer._cond:
        first = writer.submit(ReportRow(t.id, 1, 0.1, t.optuna_trial_id))
        again = writer.submit(ReportRow(t.id, 1, 0.2, t.optuna_trial_id))
    first.result(timeout=60)
    again.result(timeout=60)
    writer.write(ReportRow(t.id, 1, 0.3, t.optuna_trial_id))
    writer.close()
    with db.session() as s:
        assert s.execute(select(TrialReport.step, TrialReport.value)
                         .where(TrialReport.trial_id == t.id)).all() == [(1, 0.3)]
    assert optuna.load_study(study_name=study,
                             storage=db_url).trials[0].intermediate_values == {1: 0.1}


def test_a_report_of_a_trial_that_is_gone_fails_alone(db_url: str, tmp_path: Path) -> None:
    db = Database(db_url)
    trials, _ = _sweep(db, db_url, tmp_path)
    writer = ReportWriter(db)
    gone = writer.submit(ReportRow(max(t.id for t in trials) + 1000, 1, 0.5))
    kept = [writer.submit(ReportRow(t.id, 1, 0.5, t.optuna_trial_id)) for t in trials]
    with pytest.raises(NotFound):
        gone.result(timeout=60)
    for future in kept:
        future.result(timeout=60)
    writer.close()


def test_an_unreachable_database_fails_the_batch_as_an_outage() -> None:
    # A PostgreSQL URL nobody listens on: every connection is refused, as in a crash.
    db = Database("postgresql+psycopg://postgres@127.0.0.1:1/none", migrate=False)
    writer = ReportWriter(db)
    futures = [writer.submit(ReportRow(1, step, 0.5, 1)) for step in range(1, 4)]
    for future in futures:
        with pytest.raises(DatabaseUnavailable):
            future.result(timeout=60)
    with pytest.raises(DatabaseUnavailable):  # a caller that does not wait: raised at once
        writer.write(ReportRow(1, 4, 0.5, 1))
    writer.close()


def test_optuna_reads_back_what_the_adapter_wrote(db_url: str, tmp_path: Path) -> None:
    """The seam: rows written into Optuna's table in our transaction are the intermediate
    values Optuna reads, non-finite values in Optuna's own stored form included."""
    db = Database(db_url)
    trials, study = _sweep(db, db_url, tmp_path)
    with db.session() as s:
        record_intermediate_values(s, [(trials[0].optuna_trial_id, 1, 0.25),
                                       (trials[0].optuna_trial_id, 2, float("inf")),
                                       (trials[0].optuna_trial_id, 1, 0.75)])
    frozen = optuna.load_study(study_name=study, storage=db_url).trials[0]
    assert frozen.intermediate_values == {1: 0.25, 2: float("inf")}
