"""Sweep operations with access control: submit, list, show, cancel, trials, logs.

The CLI (on one machine) and the REST API (the hub's tuner service) both call these, so a rule
such as "another user's sweep does not exist for you" lives in exactly one place.
"""

from __future__ import annotations

import builtins
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import optuna
from sqlalchemy import func, select

from tuner.backends._base import Backend
from tuner.db import Database, ModelVersion, SweepRow, Trial, TrialReport
from tuner.errors import Forbidden, NotFound
from tuner.ledger import Ledger
from tuner.settings import Settings
from tuner.snapshot import (
    CODE_SNAPSHOT_LIMIT,
    check_service_code,
    snapshot_ignore,
    tree_size,
)
from tuner.spec import SpecError, SweepSpec
from tuner.states import CANCELLED_REASON, SWEEP_CANCELLED, SweepState, TrialState
from tuner.study import (
    check_grid_size,
    check_sampler_available,
    create_study,
    new_study_name,
    record_sweep_id,
    storage_for,
)


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
    ) -> SweepRow:
        """Validate against the backend, snapshot the code (plus ``files``, e.g. a pickled
        notebook function), create the study. Nothing is left behind when a step refuses.

        ``confined``: the submitter is a service user, not the person at this machine, so the
        code must come from their part of the data store (:mod:`tuner.snapshot`) and
        ``priority: high`` needs the right to it."""
        if spec.priority == "high" and not actor.high_priority:
            raise Forbidden(HIGH_PRIORITY_RULE)
        self._check_model_name(spec, actor)
        code: Path | None = None
        if spec.code and confined:
            code = check_service_code(spec.code, self.settings, actor.name)
        elif spec.code:
            code = Path(spec.code)
            if not code.is_dir():
                raise SpecError("code", f"{code} is not a directory")
        backend.check(spec)
        check_sampler_available(spec)
        check_grid_size(spec)
        ignore = snapshot_ignore(self.settings, actor.name if confined else None)
        if code is not None:
            size = tree_size(code, ignore)
            if size > CODE_SNAPSHOT_LIMIT:
                raise SpecError(
                    "code",
                    f"{code} holds {size // 2**20} MiB; keep data in the data store "
                    f"({self.settings.data}) and code under {CODE_SNAPSHOT_LIMIT // 2**20} MiB",
                )
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
        try:
            try:  # a backend running trials as their owner copies with the owner's rights
                backend.snapshot_code(code, staging / "code", ignore, files or {}, actor.name)
            except PermissionError as exc:
                raise SpecError("code", f"{code}: cannot be read by {actor.name} "
                                f"({exc})") from None
            study_name = new_study_name(spec, actor.name)
            create_study(spec, study_name, self.db.url, owner=actor.name)
            with self.db.session() as s:
                sweep = SweepRow(
                    name=spec.name,
                    owner=actor.name,
                    spec=spec.to_dict(),
                    backend=backend.name,
                    state=SweepState.QUEUED,
                    study_name=study_name,
                )
                s.add(sweep)
                s.flush()
                target = sweep_dir(self.settings, sweep.id)
                if target.exists():  # left by a submission that died half-way
                    shutil.rmtree(target)
                staging.rename(target)
                sweep.code_dir = str(target / "code")
        except BaseException:
            for path in (staging, target):
                if path is not None:
                    shutil.rmtree(path, ignore_errors=True)
            if study_name is not None:
                try:
                    optuna.delete_study(study_name=study_name, storage=storage_for(self.db.url))
                except KeyError:  # the study was never created
                    pass
            raise
        record_sweep_id(sweep.study_name, self.db.url, sweep.id)
        return sweep

    def _check_model_name(self, spec: SweepSpec, actor: Actor) -> None:
        """Model names are one namespace (the registry's directories); a name another user
        registered first is refused now, not when the sweep ends, and without saying whose."""
        if spec.promote is None:
            return
        with self.db.session() as s:
            owner = s.scalar(
                select(ModelVersion.owner).where(ModelVersion.model == spec.promote.model)
                .limit(1)
            )
        if owner is not None and owner != actor.name:
            raise SpecError(
                "promote.model",
                f"the model name {spec.promote.model!r} is taken by another user; choose "
                "another name",
            )

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

    def log_path(self, sweep_id: int, number: int, actor: Actor) -> Path:
        trial = self.trial(sweep_id, number, actor)
        if not trial.log_path or not Path(trial.log_path).exists():
            raise NotFound(f"trial {number} of sweep {sweep_id} has no log yet")
        return Path(trial.log_path)

    def state_counts(self, sweep_id: int) -> dict[TrialState, int]:
        with self.db.session() as s:
            rows = s.execute(
                select(Trial.state, func.count())
                .where(Trial.sweep_id == sweep_id)
                .group_by(Trial.state)
            )
            return {state: n for state, n in rows}

    # --- changes -------------------------------------------------------------------------

    def request_cancel(self, sweep_id: int, actor: Actor, runs_here: bool = False) -> SweepRow:
        """Ask the sweep's controller to stop; with no live controller, cancel it here.
        ``runs_here``: this process's engine runs the sweep (it is woken by the caller)."""
        self.get(sweep_id, actor)
        if not self.ledger.request_cancel(sweep_id, runs_here):
            self.cancel_offline(sweep_id)
        return self.get(sweep_id, actor)

    def cancel_offline(self, sweep_id: int) -> SweepRow:
        """Cancel a sweep no controller runs, the way its controller ends a cancelled one
        (:meth:`tuner.ledger.Ledger.end_sweep`): unfinished trials become cancelled (FAIL in
        Optuna, which has no cancelled state, told after our commit)."""
        sweep = self.ledger.sweep(sweep_id)

        def study() -> optuna.Study:
            return optuna.load_study(study_name=sweep.study_name, storage=storage_for(self.db.url))

        self.ledger.end_sweep(
            sweep_id, lambda _: (SweepState.CANCELLED, CANCELLED_REASON), SWEEP_CANCELLED, study
        )
        return self.ledger.sweep(sweep_id)
