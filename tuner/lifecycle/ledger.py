"""The ledger: the one place a sweep's or a trial's row changes.

Every state change checks its transition against :mod:`tuner.lifecycle.states` (an illegal one
raises :class:`~tuner.lifecycle.states.IllegalTransition` before anything is written), writes the
row and the sweep's counters in one transaction, commits, and only then tells Optuna. That order is
the rule: Optuna writes through its own connection, which must never wait on an open transaction of
ours (SQLite has one writer), and a crash between the two leaves our row ahead of Optuna, which
recovery repairs by telling Optuna again (:mod:`tuner.scheduling.recovery`).

The controller, the offline cancel (:class:`tuner.sweep_store.SweepStore`), recovery and the REST
API all change states through here; nothing else writes ``state``.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast

from optuna.trial import TrialState as OptunaTrialState
from sqlalchemy import CursorResult, func, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from tuner import metrics
from tuner.db import Database, SweepRow, Trial, TrialReport, utcnow
from tuner.db.outage import patient
from tuner.errors import Conflict, NotFound
from tuner.lifecycle.liveness import controller_alive, is_mine, this_process
from tuner.lifecycle.states import (
    COUNTED,
    SweepState,
    TrialState,
    check_sweep,
    check_trial,
    counter_column,
)
from tuner.lifecycle.trial_paths import TrialPaths
from tuner.search.ranking import is_better
from tuner.search.study import optuna_state


class Teller(Protocol):
    """What the ledger tells outcomes to: the controller's study mirror, or an Optuna study."""

    def tell(
        self,
        trial: int,
        values: float | Sequence[float] | None = None,
        state: OptunaTrialState | None = None,
        skip_if_finished: bool = False,
    ) -> object: ...


def tell_quietly(teller: Teller, number: int, state: TrialState, value: float | None,
                 values: Sequence[float] | None = None) -> None:
    """Tell Optuna that trial ``number`` ended in our ``state``; a trial Optuna already finished
    (a crash between our commit and Optuna's) is left as it is. ``values``: a multi-objective
    study's values, in the order of its directions (else ``value``)."""
    theirs = optuna_state(state)
    if theirs == OptunaTrialState.COMPLETE:
        teller.tell(number, list(values) if values else value, skip_if_finished=True)
    else:
        teller.tell(number, state=theirs, skip_if_finished=True)


@dataclass(frozen=True)
class Counts:
    """A sweep's finished-trial counters, as the ledger just wrote them: one field per state
    of :data:`~tuner.lifecycle.states.COUNTED`, named by it."""

    completed: int = 0
    pruned: int = 0
    failed: int = 0

    @classmethod
    def of(cls, sweep: SweepRow) -> Counts:
        """The counters a sweep row holds."""
        return cls(**{state.value: getattr(sweep, counter_column(state)) for state in COUNTED})


@dataclass(frozen=True)
class AttemptStart:
    """What launching the next attempt of a trial needs from its row."""

    trial_id: int
    number: int
    attempt: int
    params: dict[str, Any]
    paths: TrialPaths
    optuna_trial_id: int
    previous_reason: str | None  # why the last attempt ended (its log header says)
    preemptions: int = 0  # earlier attempts the GPU pool stopped: not counted as retries


#: How an ending sweep learns its final state and reason from its counters.
Decide = Callable[[Counts], tuple[SweepState, str | None]]


class Ledger:
    """Reads and changes sweep and trial rows under the lifecycle's rules."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # --- reading -------------------------------------------------------------------------

    @patient
    def sweep(self, sweep_id: int) -> SweepRow:
        with self.db.session() as s:
            sweep = s.get(SweepRow, sweep_id)
            if sweep is None:
                raise NotFound(f"sweep {sweep_id} not found")
            return sweep

    @patient
    def trials(self, sweep_id: int) -> list[Trial]:
        with self.db.session() as s:
            return list(s.scalars(select(Trial).where(Trial.sweep_id == sweep_id)))

    # --- sweeps --------------------------------------------------------------------------

    @patient
    def claim(self, sweep_id: int, url: str | None = None) -> SweepState:
        """Make this process the sweep's controller, unless a live one already is; returns
        the sweep's state (``cancelling`` when a cancel waits for the new controller).
        ``url``: where this process takes trials' reports (another replica routes there)."""
        with self.db.session() as s:
            sweep = _sweep(s, sweep_id, lock=True)
            if sweep.state.is_finished():
                raise Conflict(f"sweep {sweep_id} is {sweep.state}; nothing to resume")
            if not is_mine(sweep) and controller_alive(sweep):
                raise Conflict(
                    f"sweep {sweep_id} is being run by process {sweep.controller_pid} "
                    f"on {sweep.controller_host}"
                )
            sweep.controller_host = socket.gethostname()
            sweep.controller_pid = os.getpid()
            sweep.controller_start = this_process()
            sweep.controller_url = url
            sweep.heartbeat_at = utcnow()
            if sweep.state != SweepState.CANCELLING:
                sweep.state = check_sweep(sweep.state, SweepState.RUNNING)
            sweep.started_at = sweep.started_at or utcnow()
            return sweep.state

    @patient
    def heartbeat(self, sweep_id: int) -> SweepState | None:
        """The controller is alive; returns the sweep's state (a cancel asked elsewhere shows
        as ``cancelling``), None when the sweep is gone."""
        with self.db.session() as s:
            sweep = s.get(SweepRow, sweep_id)
            if sweep is None:
                return None
            sweep.heartbeat_at = utcnow()
            return sweep.state

    @patient
    def mark_cancelling(
        self, sweep_id: int, runs_here: bool = False
    ) -> Literal["marked", "no controller", "already"]:
        """Mark the sweep ``cancelling`` for its live controller to stop it (``marked``);
        ``no controller`` when none runs it (then :meth:`end_sweep` cancels it here).
        ``runs_here``: this process hosts its controller, whatever the process's command line
        says. A cancel is idempotent: a sweep already ``cancelled`` is left as it is
        (``already``), so a cancel sent again (its answer lost, the database away) changes
        nothing; a sweep that ended otherwise cannot be cancelled."""
        with self.db.session() as s:
            sweep = _sweep(s, sweep_id, lock=True)
            if sweep.state == SweepState.CANCELLED:
                return "already"
            if sweep.state.is_finished():
                raise Conflict(f"sweep {sweep_id} is already {sweep.state}")
            if not (runs_here or controller_alive(sweep)):
                return "no controller"
            sweep.state = check_sweep(sweep.state, SweepState.CANCELLING)
            return "marked"

    @patient
    def note_cold_start(self, sweep_id: int, cold: str | None) -> None:
        with self.db.session() as s:
            _sweep(s, sweep_id).cold_start = cold

    @patient
    def note(self, sweep_id: int, reason: str, model_version_id: int | None = None) -> None:
        """Say something about an ended sweep (what became of its model)."""
        with self.db.session() as s:
            sweep = _sweep(s, sweep_id)
            sweep.reason = reason
            if model_version_id is not None:
                sweep.model_version_id = model_version_id

    @patient
    def release(self, sweep_id: int) -> None:
        """This process stops controlling the sweep without ending it (shutdown): the next
        controller may claim it at once."""
        with self.db.session() as s:
            sweep = s.get(SweepRow, sweep_id)
            if sweep is not None and sweep.controller_pid == os.getpid():
                sweep.controller_pid = None

    def end_sweep(
        self, sweep_id: int, decide: Decide, trials_reason: str, teller: Callable[[], Teller]
    ) -> SweepState:
        """End the sweep: its unfinished trials become cancelled with ``trials_reason``, the
        sweep takes the state ``decide`` gives for its counters. After the commit, Optuna is
        told each cancelled trial failed (it has no cancelled state). The controller's end and
        the offline cancel are both this."""
        state, cancelled, ended_now = self._write_end(sweep_id, decide, trials_reason)
        if cancelled:
            study = teller()
            for number in cancelled:
                tell_quietly(study, number, TrialState.CANCELLED, None)
        if ended_now:  # a sweep that another process ended meanwhile is counted there
            metrics.SWEEPS_FINISHED.labels(state).inc()
        return state

    @patient
    def _write_end(
        self, sweep_id: int, decide: Decide, trials_reason: str
    ) -> tuple[SweepState, list[int], bool]:
        """:meth:`end_sweep`'s transaction: the state, the numbers of the trials it
        cancelled, and whether this transaction ended the sweep. Idempotent: a sweep already
        ended is answered as it was ended (its trials cancelled with ``trials_reason``), not
        ended now (a retry after a commit whose answer was lost counts as not ended now: the
        finished-sweeps metric may miss that sweep, never count one twice)."""
        with self.db.session() as s:
            sweep = _sweep(s, sweep_id, lock=True)
            if sweep.state.is_finished():
                return SweepState(sweep.state), list(s.scalars(
                    select(Trial.number).where(Trial.sweep_id == sweep_id,
                                               Trial.state == TrialState.CANCELLED,
                                               Trial.reason == trials_reason))), False
            open_trials = s.scalars(
                select(Trial).where(
                    Trial.sweep_id == sweep_id, Trial.state.in_(TrialState.unfinished())
                )
            )
            cancelled = []
            for row in open_trials:
                row.state = check_trial(row.state, TrialState.CANCELLED)
                row.reason, row.finished_at, row.token_hash = trials_reason, utcnow(), None
                cancelled.append(row.number)
            state, reason = decide(Counts.of(sweep))
            sweep.state = check_sweep(sweep.state, state)
            sweep.reason = reason
            sweep.finished_at = utcnow()
            sweep.controller_pid = None
        return state, cancelled, True

    # --- trials --------------------------------------------------------------------------

    @patient
    def add_trial(
        self, sweep_id: int, number: int, optuna_trial_id: int, params: dict[str, Any],
        paths: TrialPaths,
    ) -> int:
        """A new pending trial (asked from Optuna); returns its id. Idempotent (a retry
        after a lost commit answer finds the row its last try wrote)."""
        with self.db.session() as s:
            written = s.scalar(select(Trial.id).where(Trial.sweep_id == sweep_id,
                                                      Trial.number == number))
            if written is not None:
                return written
            row = Trial(
                sweep_id=sweep_id,
                number=number,
                optuna_trial_id=optuna_trial_id,
                state=TrialState.PENDING,
                params=params,
                workdir=str(paths.workdir),
                log_path=str(paths.log_path),
                artifact_dir=str(paths.artifact_dir),
            )
            s.add(row)
            s.flush()
            return row.id

    @patient
    def start_attempt(self, sweep_id: int, trial_id: int, token_hash: str) -> AttemptStart:
        """The trial's next attempt starts (pending → running) with a fresh token.
        Idempotent: the attempt whose token is already the trial's is not started again."""
        with self.db.session() as s:
            row = _trial(s, trial_id)
            if row.state == TrialState.RUNNING and row.token_hash == token_hash:
                return _attempt_start(row)
            row.state = check_trial(row.state, TrialState.RUNNING)
            row.attempts += 1
            row.token_hash = token_hash
            row.started_at = utcnow()
            if row.attempts == 1:
                # An increment in the statement: the sweep's row (its spec among it) is not
                # read on every launch.
                started = cast(CursorResult[Any], s.execute(
                    update(SweepRow).where(SweepRow.id == sweep_id)
                    .values(n_started=SweepRow.n_started + 1)
                ))
                if started.rowcount == 0:
                    raise NotFound(f"sweep {sweep_id} not found")
            return _attempt_start(row)

    @patient
    def set_reasons(self, reasons: dict[int, str | None]) -> None:
        """Say why each trial (by id) is where it is (waiting for a quota, restarted), or
        clear it (None); not a state change."""
        with self.db.session() as s:
            for trial_id, reason in reasons.items():
                _trial(s, trial_id).reason = reason

    @patient
    def requeue(self, trial_ids: Sequence[int], reason: str, preempted: bool = False) -> None:
        """Running → pending: a failed attempt with retries left, attempts that died with
        their controller, or (``preempted``) an attempt the GPU pool stopped for a notebook,
        which is counted in ``preemptions`` so that it is no retry. The old attempt's token
        dies; the next attempt gets a new one. Idempotent: a trial already pending without a
        token was requeued (a retry after a lost commit answer counts no second preemption)."""
        with self.db.session() as s:
            for trial_id in trial_ids:
                row = _trial(s, trial_id)
                if row.state == TrialState.PENDING and row.token_hash is None:
                    continue
                row.state = check_trial(row.state, TrialState.PENDING)
                row.reason, row.token_hash = reason, None
                if preempted:
                    row.preemptions = (row.preemptions or 0) + 1

    def finish_trial(
        self,
        sweep_id: int,
        trial_id: int,
        state: TrialState,
        value: float | None,
        reason: str | None,
        has_model: bool,
        direction: str,
        teller: Teller,
        figures: dict[str, float] | None = None,
        values: Sequence[float] | None = None,
    ) -> Counts:
        """The trial ends in ``state``: its row, the sweep's counters and best trial, then
        Optuna. ``figures``: every metric it reported and the serving figures measured of its
        model; ``values``: a multi-objective study's values. Returns the counters as written."""
        number, counts = self._write_finish(sweep_id, trial_id, state, value, reason, has_model,
                                            direction, figures)
        metrics.TRIALS_FINISHED.labels(state).inc()
        tell_quietly(teller, number, state, value, values)
        return counts

    @patient
    def _write_finish(
        self, sweep_id: int, trial_id: int, state: TrialState, value: float | None,
        reason: str | None, has_model: bool, direction: str,
        figures: dict[str, float] | None = None,
    ) -> tuple[int, Counts]:
        """:meth:`finish_trial`'s transaction (retried alone through an outage: the tell
        after it is not part of it). Idempotent: a trial already ended in ``state`` is not
        counted again."""
        with self.db.session() as s:
            row = _trial(s, trial_id)
            sweep = _sweep(s, sweep_id)
            if row.state == state and row.finished_at is not None and row.token_hash is None:
                return row.number, Counts.of(sweep)
            row.state = check_trial(row.state, state)
            row.reason, row.finished_at = reason, utcnow()
            row.has_model = has_model
            row.token_hash = None  # the attempt's token dies with it
            if value is not None:
                row.value = value
            if figures:
                row.metrics = dict(figures)
            number = row.number
            if state in COUNTED:
                column = counter_column(state)
                setattr(sweep, column, getattr(sweep, column) + 1)
            if (state == TrialState.COMPLETED and value is not None
                    and is_better(value, sweep.best_value, direction)):
                sweep.best_value, sweep.best_trial_number = value, number
            return number, Counts.of(sweep)

    @patient
    def adopt_outcome(self, trial_id: int, state: TrialState, value: float | None) -> None:
        """Recovery: Optuna already holds this unfinished trial's outcome; our row takes it
        (idempotent)."""
        with self.db.session() as s:
            row = _trial(s, trial_id)
            if row.state == state:
                return
            row.state = check_trial(row.state, state)
            row.value = value if value is not None else row.value
            row.finished_at = row.finished_at or utcnow()
            row.token_hash = None

    @patient
    def recount(self, sweep_id: int) -> Counts:
        """Recovery: the sweep's counters counted from its trials, after outcomes were adopted
        from Optuna (:meth:`adopt_outcome` leaves the counters to this) and whatever an
        earlier version of tunehub left half-written."""
        with self.db.session() as s:
            counts: dict[TrialState, int] = dict(
                s.execute(
                    select(Trial.state, func.count())
                    .where(Trial.sweep_id == sweep_id)
                    .group_by(Trial.state)
                ).all()
            )
            sweep = _sweep(s, sweep_id)
            for state in COUNTED:
                setattr(sweep, counter_column(state), counts.get(state, 0))
            return Counts.of(sweep)


def upsert(s: Session, table: type[TrialReport]) -> Any:
    """``INSERT`` with ``ON CONFLICT`` for the session's database (SQLite and PostgreSQL
    both have it, with the same SQLAlchemy API)."""
    if s.get_bind().dialect.name == "postgresql":
        return postgresql_insert(table)
    return sqlite_insert(table)


def _sweep(s: Session, sweep_id: int, lock: bool = False) -> SweepRow:
    sweep = s.get(SweepRow, sweep_id, with_for_update=lock)
    if sweep is None:
        raise NotFound(f"sweep {sweep_id} not found")
    return sweep


def _attempt_start(row: Trial) -> AttemptStart:
    return AttemptStart(
        trial_id=row.id,
        number=row.number,
        attempt=row.attempts,
        params=dict(row.params),
        paths=TrialPaths.of(row),
        optuna_trial_id=row.optuna_trial_id,
        previous_reason=row.reason,
        preemptions=row.preemptions or 0,
    )


def _trial(s: Session, trial_id: int) -> Trial:
    row = s.get(Trial, trial_id)
    if row is None:
        raise NotFound(f"trial {trial_id} not found")
    return row
