"""Sweep operations with access control: submit, list, show, cancel, trials, logs.

The CLI (on one machine) and the REST API (the hub's tuner service) both call these, so a rule
such as "another user's sweep does not exist for you" lives in exactly one place.
"""

from __future__ import annotations

import builtins
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import optuna
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from tunehub_base.options import setting
from tunehub_base.settings import Settings
from tuner import untrusted_files
from tuner.backends._base import Backend
from tuner.db import Database, SweepRow, Trial, TrialReport
from tuner.db.outage import patient, unreachable
from tuner.errors import Forbidden, NotFound
from tuner.lifecycle.ledger import Ledger
from tuner.lifecycle.states import CANCELLED_REASON, SWEEP_CANCELLED, SweepState, TrialState
from tuner.limits import Limits
from tuner.search.study import (
    check_grid_size,
    check_sampler_available,
    create_study,
    new_study_name,
    record_sweep_id,
    storage_for,
)
from tuner.serving import names
from tuner.snapshot import CodeSource, check_service_code, code_owner, snapshot_ignore
from tuner.spec import SpecError, SweepSpec


@dataclass(frozen=True)
class Actor:
    """Who is asking: a user name, whether they may see everyone's sweeps, and whether they
    may submit ``priority: high`` sweeps (see :data:`HIGH_PRIORITY_RULE`)."""

    name: str
    admin: bool = False
    high_priority: bool = False


HIGH_PRIORITY_RULE = (
    "priority: high is for tuner admins and members of the hub group named by "
    "c.TunehubHub.high_priority_group (TUNEHUB_HIGH_PRIORITY_GROUP, default "
    "'tuner-priority'); use normal or low"
)


def local_actor() -> Actor:
    """The person at this machine's terminal: owner of what they run, admin of their home."""
    import getpass

    return Actor(
        name=os.environ.get("TUNEHUB_USER") or getpass.getuser(), admin=True, high_priority=True
    )


def sweep_dir(settings: Settings, sweep_id: int) -> Path:
    return settings.sweeps_dir / str(sweep_id)


class LocalControllers(Protocol):
    """The sweep controllers this process hosts, as cancelling sees them
    (:class:`~tuner.scheduling.host.SweepHost`)."""

    def runs(self, sweep_id: int) -> bool: ...

    def cancel(self, sweep_id: int) -> bool: ...


class SweepStore:
    """Reads and writes sweeps for an :class:`Actor`."""

    def __init__(self, db: Database, settings: Settings) -> None:
        self.db = db
        self.settings = settings
        self.ledger = Ledger(db)

    # --- submission ----------------------------------------------------------------------

    def submit(
        self,
        spec: SweepSpec,
        actor: Actor,
        backend: Backend,
        files: dict[str, bytes] | None = None,
        confined: bool = False,
        request_key: str | None = None,
    ) -> SweepRow:
        """Validate against the backend, snapshot the code (plus ``files``, e.g. a pickled
        notebook function), create the study. Nothing is left behind when a step refuses.

        ``confined``: the submitter is a service user, not the person at this machine, so the
        code must come from their part of the data store (:mod:`tuner.snapshot`) and
        ``priority: high`` needs the right to it.

        ``request_key``: the request's Idempotency-Key. The sweep the same person submitted
        with it is the answer, unchanged (the first answer was lost: a connection cut while
        the database answered the commit, or the client's); a sweep is submitted once."""
        if request_key is not None:
            earlier = self._submitted(actor, request_key)
            if earlier is not None:
                return earlier
        if spec.priority == "high" and not actor.high_priority:
            raise Forbidden(HIGH_PRIORITY_RULE)
        Limits.from_env().check(spec)  # the per-person caps, the same for every backend
        self._reserve_model_name(spec, actor, names.check)
        code: CodeSource | Path | None = None
        if spec.code and confined:
            code = check_service_code(spec.code, self.settings, actor.name,
                                      code_owner(self.settings, actor.name))
        elif spec.code:
            code = Path(spec.code)
            if not code.is_dir():
                raise SpecError("code", f"{code} is not a directory")
        backend.check(spec)
        check_sampler_available(spec)
        check_grid_size(spec)
        # The copy itself stops at tuner.snapshot.CODE_SNAPSHOT_LIMIT: a size measured before
        # (as root, by path) would be a look at what the submitter may not read, and stale.
        ignore = snapshot_ignore(self.settings, actor.name if confined else None)
        # The snapshot is copied into a staging directory before any transaction: copying
        # can take seconds, and an open write transaction would hold SQLite's one write lock
        # (trial reports, heartbeats) that long. Then the study: Optuna writes through its own
        # connection, which must not wait on a transaction of ours. Then our row, and the
        # staged snapshot renamed into the sweep's directory (instant). Last, after our
        # commit, the study learns the sweep's id (a user attribute, for optuna-dashboard; best
        # effort: the sweep exists by then, see record_sweep_id).
        self.settings.sweeps_dir.mkdir(parents=True, exist_ok=True)
        staging = self.settings.sweeps_dir / f".incoming-{uuid.uuid4().hex}"
        target: Path | None = None
        study_name: str | None = None
        committing = False
        try:
            try:  # a backend running trials as their owner copies with the owner's rights
                backend.snapshot_code(code, staging / "code", ignore, files or {}, actor.name)
            except PermissionError as exc:
                raise SpecError("code", f"{code}: cannot be read by {actor.name} "
                                f"({exc})") from None
            self._reserve_model_name(spec, actor, names.claim)  # every check passed
            study_name = new_study_name(spec, actor.name, request_key)
            create_study(spec, study_name, self.db.url, owner=actor.name)
            with self.db.session() as s:
                sweep = SweepRow(
                    name=spec.name,
                    owner=actor.name,
                    spec=spec.to_dict(),
                    backend=backend.name,
                    state=SweepState.QUEUED,
                    study_name=study_name,
                    request_key=request_key,
                )
                s.add(sweep)
                s.flush()
                target = sweep_dir(self.settings, sweep.id)
                if target.exists():  # left by a submission that died half-way
                    shutil.rmtree(target)
                staging.rename(target)
                sweep.code_dir = str(target / "code")
                committing = True
        except BaseException as exc:
            if committing and unreachable(exc):
                # The commit may have landed with its answer lost: the sweep would then be
                # whole and its code and study must stay (the request sent again finds it by
                # its key; otherwise the next sweep given this id replaces the directory).
                raise
            earlier = None
            if request_key is not None and isinstance(exc, IntegrityError):
                earlier = self._submitted(actor, request_key)  # sent twice at once
            for path in (staging, target):
                if path is not None:
                    shutil.rmtree(path, ignore_errors=True)
            # The study is the key's (new_study_name): the request that won holds it.
            if study_name is not None and (earlier is None or earlier.study_name != study_name):
                try:
                    optuna.delete_study(study_name=study_name, storage=storage_for(self.db.url))
                except KeyError:  # the study was never created
                    pass
            if earlier is not None:
                return earlier
            raise
        record_sweep_id(sweep.study_name, self.db.url, sweep.id)
        return sweep

    @patient
    def _submitted(self, actor: Actor, request_key: str) -> SweepRow | None:
        with self.db.session() as s:
            return s.scalar(select(SweepRow).where(SweepRow.owner == actor.name,
                                                   SweepRow.request_key == request_key))

    def _reserve_model_name(
        self, spec: SweepSpec, actor: Actor, how: Callable[[Database, str, str], object]
    ) -> None:
        """The one rule of model names (:mod:`tuner.serving.names`), answered as a 400 on
        ``promote.model``: ``names.check`` before the slow steps, ``names.claim`` after them."""
        if spec.promote is None:
            return
        try:
            how(self.db, spec.promote.model, actor.name)
        except names.NameTaken as exc:
            raise SpecError("promote.model", str(exc)) from None

    # --- queries -------------------------------------------------------------------------

    def get(self, sweep_id: int, actor: Actor) -> SweepRow:
        with self.db.session() as s:
            sweep = s.get(SweepRow, sweep_id)
            if sweep is None or not (actor.admin or sweep.owner == actor.name):
                raise NotFound(f"sweep {sweep_id} not found")
            return sweep

    def list(self, actor: Actor, limit: int = 200) -> builtins.list[SweepRow]:
        with self.db.session() as s:
            query = select(SweepRow).order_by(SweepRow.id.desc()).limit(limit)
            if not actor.admin:
                query = query.where(SweepRow.owner == actor.name)
            return list(s.scalars(query))

    def trials(self, sweep_id: int, actor: Actor) -> builtins.list[Trial]:
        self.get(sweep_id, actor)
        with self.db.session() as s:
            query = select(Trial).where(Trial.sweep_id == sweep_id).order_by(Trial.number)
            return list(s.scalars(query))

    def trial(self, sweep_id: int, number: int, actor: Actor) -> Trial:
        self.get(sweep_id, actor)
        with self.db.session() as s:
            trial = s.scalar(
                select(Trial).where(Trial.sweep_id == sweep_id, Trial.number == number)
            )
            if trial is None:
                raise NotFound(f"sweep {sweep_id} has no trial {number}")
            return trial

    def reports(self, sweep_id: int, actor: Actor) -> dict[int, builtins.list[tuple[int, float]]]:
        """Intermediate values per trial number, in step order."""
        self.get(sweep_id, actor)
        with self.db.session() as s:
            rows = s.execute(
                select(Trial.number, TrialReport.step, TrialReport.value)
                .join(TrialReport, TrialReport.trial_id == Trial.id)
                .where(Trial.sweep_id == sweep_id)
                .order_by(Trial.number, TrialReport.step)
            )
            out: dict[int, builtins.list[tuple[int, float]]] = {}
            for number, step, value in rows:
                out.setdefault(number, []).append((step, value))
            return out

    def read_log(self, sweep_id: int, number: int, actor: Actor) -> bytes:
        """The end of a trial's log (``TUNEHUB_LOG_MAX_BYTES``), for its owner or an admin.

        The file sits where a trial (or, on Kubernetes, its pod) may have put something else
        in its place: it is opened as :mod:`tuner.untrusted_files` says, so a link to a secret
        or a FIFO is "no log", never the secret and never a read that waits. Blocking file I/O:
        callers on the event loop run it in a thread."""
        trial = self.trial(sweep_id, number, actor)
        missing = NotFound(f"trial {number} of sweep {sweep_id} has no log yet")
        if not trial.log_path:
            raise missing
        try:
            data, skipped = untrusted_files.read_tail(
                trial.log_path, setting("TUNEHUB_LOG_MAX_BYTES").number())
        except OSError:
            raise missing from None
        if skipped:
            return f"[{skipped} earlier bytes of this log left out]\n".encode() + data
        return data

    def state_counts(self, sweep_id: int) -> dict[TrialState, int]:
        with self.db.session() as s:
            rows = s.execute(
                select(Trial.state, func.count())
                .where(Trial.sweep_id == sweep_id)
                .group_by(Trial.state)
            )
            return {state: n for state, n in rows}

    # --- changes -------------------------------------------------------------------------

    def cancel(
        self, sweep_id: int, actor: Actor, here: LocalControllers | None = None
    ) -> SweepRow:
        """Cancel a sweep, the one way the API and the CLI both take: a live controller is
        asked to stop (the sweep shows ``cancelling`` until it has); with none, the sweep is
        cancelled here, now. ``here``: the controllers this process hosts (the tuner
        service's); one of them running the sweep is woken at once, one in another process
        sees ``cancelling`` at its next heartbeat. A sweep already cancelled is answered as it
        is (a cancel may be sent again); one that ended otherwise is a
        :class:`~tuner.errors.Conflict`."""
        self.get(sweep_id, actor)
        runs_here = here is not None and here.runs(sweep_id)
        marked = self.ledger.mark_cancelling(sweep_id, runs_here)
        if marked == "no controller":
            self._cancel_here(sweep_id)
        elif marked == "marked" and here is not None:
            here.cancel(sweep_id)
        return self.get(sweep_id, actor)

    def _cancel_here(self, sweep_id: int) -> SweepRow:
        """Cancel a sweep no controller runs, the way its controller ends a cancelled one
        (:meth:`tuner.lifecycle.ledger.Ledger.end_sweep`): unfinished trials become cancelled (FAIL
        in Optuna, which has no cancelled state, told after our commit)."""
        sweep = self.ledger.sweep(sweep_id)

        def study() -> optuna.Study:
            return optuna.load_study(study_name=sweep.study_name, storage=storage_for(self.db.url))

        self.ledger.end_sweep(
            sweep_id, lambda _: (SweepState.CANCELLED, CANCELLED_REASON), SWEEP_CANCELLED, study
        )
        return self.ledger.sweep(sweep_id)
