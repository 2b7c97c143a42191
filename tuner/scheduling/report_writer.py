"""Trials' intermediate values, written in group commits.

A report is answered only once its value is committed (a trial told "go on" never loses what it
sent), but that commit is shared: one thread per process takes every report waiting at that
moment and writes all of them in one transaction, tunehub's rows (the report, the trial's latest
value) and Optuna's intermediate values alike. A commit's cost (a WAL flush on PostgreSQL, one
writer at a time on SQLite) is then paid once per batch instead of once per report, and the
event loop never waits on the database for a report: while a batch commits, the loop takes the
next reports in, and they form the next batch. With one trial reporting, a batch is that one
report and nothing waits longer than before; with hundreds, batches grow by themselves.

Order and loss: each trial sends its next report only after the answer to the last (the SDK
waits), so a trial's reports reach the queue, and the database, in the order they were made. A
crash loses only reports that were not answered yet, which their trials send again after the
tuner comes back (the SDK retries), as before.

Failures: an unreachable database fails the whole batch with
:class:`~tuner.db.outage.DatabaseUnavailable` (the API answers 503 and the SDK sends again; a
caller that waits outages out, :meth:`ReportWriter.write`, tries again with backoff). Any other
error is the batch's rows written one at a time, so one bad report (a trial row that is gone)
fails itself and nobody else's.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from tuner.db import Database, Trial, TrialReport, utcnow
from tuner.db.outage import (
    DatabaseUnavailable,
    note_reachable,
    note_unreachable,
    patient,
    unreachable,
)
from tuner.errors import NotFound
from tuner.lifecycle.ledger import upsert
from tuner.search.optuna_adapter import record_intermediate_values

log = logging.getLogger("tunehub.reports")

#: At most this many reports in one transaction (a bound on its size, not a wait).
MAX_BATCH = 2000


@dataclass(frozen=True)
class ReportRow:
    """One intermediate value to keep. ``optuna_trial_id``: Optuna's trial to record the step
    in, or None when Optuna has it already (a rerun attempt repeating its steps) or takes none
    (a multi-objective sweep): tunehub's rows are written either way."""

    trial_id: int
    step: int
    value: float
    optuna_trial_id: int | None = None


class ReportWriter:
    """The process's one writer of intermediate values (see the module's docstring)."""

    def __init__(self, db: Database, max_batch: int = MAX_BATCH) -> None:
        self.db = db
        self.max_batch = max_batch
        self._cond = threading.Condition()
        self._pending: list[tuple[ReportRow, Future[None]]] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        #: Transactions committed and reports in them (the benchmark reads the mean batch).
        self.commits = 0
        self.written = 0

    def submit(self, row: ReportRow) -> Future[None]:
        """Queue ``row``; the future is done once it is committed (or failed)."""
        future: Future[None] = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the report writer is closed")
            self._pending.append((row, future))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="report-writer",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()
        return future

    def write(self, row: ReportRow) -> None:
        """Submit ``row`` and wait for its commit, in the calling thread: for callers that are
        not on an event loop's request path (the in-process backend). An outage is waited out
        or raised as :func:`~tuner.db.outage.patient` says for the caller."""
        patient(lambda: self.submit(row).result())()

    def close(self) -> None:
        """Write what is queued, then end the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join()

    # --- the writer thread ---------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return
                batch = self._pending[:self.max_batch]
                del self._pending[:self.max_batch]
            self._commit(batch)

    def _commit(self, batch: list[tuple[ReportRow, Future[None]]]) -> None:
        try:
            missing = self._write([row for row, _ in batch])
        except Exception as exc:
            if unreachable(exc):
                note_unreachable()
                for _, future in batch:
                    error = DatabaseUnavailable("database unreachable; retry shortly")
                    error.__cause__ = exc
                    future.set_exception(error)
                return
            if len(batch) > 1:
                for item in batch:
                    self._commit([item])
                return
            log.error("report of trial %d not written: %s", batch[0][0].trial_id, exc)
            batch[0][1].set_exception(exc)
            return
        note_reachable()
        self.commits += 1
        self.written += len(batch)
        for row, future in batch:
            if row.trial_id in missing:
                future.set_exception(NotFound(f"trial {row.trial_id} not found"))
            else:
                future.set_result(None)

    def _write(self, rows: Sequence[ReportRow]) -> set[int]:
        """One transaction for ``rows``; returns the trial ids that have no row (their reports
        are not written)."""
        with self.db.session() as s:
            ids = {row.trial_id for row in rows}
            found = set(s.scalars(select(Trial.id).where(Trial.id.in_(ids))))
            rows = [row for row in rows if row.trial_id in found]
            if rows:
                _write_rows(s, rows)
        return ids - found


def _write_rows(s: Session, rows: Sequence[ReportRow]) -> None:
    """tunehub's report rows (a step reported again replaces its value), each trial's latest
    value, and Optuna's intermediate values (Optuna keeps a step's first value)."""
    reports: dict[tuple[int, int], float] = {}
    latest: dict[int, tuple[int, float]] = {}
    optuna_rows: dict[tuple[int, int], float] = {}
    for row in rows:  # in the order they were reported
        reports[(row.trial_id, row.step)] = row.value
        latest[row.trial_id] = (row.step, row.value)
        if row.optuna_trial_id is not None:
            optuna_rows.setdefault((row.optuna_trial_id, row.step), row.value)
    now = utcnow()
    insert = upsert(s, TrialReport)
    s.execute(
        insert.on_conflict_do_update(index_elements=[TrialReport.trial_id, TrialReport.step],
                                     set_={"value": insert.excluded.value}),
        [{"trial_id": t, "step": step, "value": v, "created_at": now}
         for (t, step), v in reports.items()],
    )
    # The ORM's bulk UPDATE by primary key: one statement, executed for every trial.
    s.execute(update(Trial), [{"id": t, "last_step": step, "value": v}
                              for t, (step, v) in latest.items()])
    if optuna_rows:
        record_intermediate_values(s, [(t, step, v) for (t, step), v in optuna_rows.items()])
