"""SQLAlchemy models: sweeps, trials, their reports, and model versions.

Table names carry a ``tunehub_`` prefix because Optuna's RDBStorage keeps its study in the same
database with its own ``studies``/``trials`` tables.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, TypeVar

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from tuner.lifecycle.states import SweepState, TrialState


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


class Base(DeclarativeBase):
    pass


StateT = TypeVar("StateT", SweepState, TrialState)


class StateColumn(TypeDecorator[StateT]):
    """A state column: the state's string in the database (what the schema always held), its
    :mod:`tuner.lifecycle.states` member in Python. Which states exist and how they change:
    :mod:`tuner.lifecycle.states`; who changes them: :mod:`tuner.lifecycle.ledger`."""

    impl = String(16)
    cache_ok = True

    def __init__(self, states: type[StateT]) -> None:
        super().__init__()
        self.states: type[StateT] = states

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else str(self.states(value))

    def process_result_value(self, value: str | None, dialect: Dialect) -> StateT | None:
        return None if value is None else self.states(value)


class SweepRow(Base):
    """One sweep in the tuner's database. Named ``SweepRow`` so it is never confused with the
    notebook's :class:`tuner.Sweep`, the user-facing handle on the same sweep."""

    __tablename__ = "tunehub_sweeps"
    __table_args__ = (
        Index("uq_tunehub_sweep_request", "owner", "request_key", unique=True),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    owner: Mapped[str] = mapped_column(String(255), index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    backend: Mapped[str] = mapped_column(String(32), default="local")
    state: Mapped[SweepState] = mapped_column(
        StateColumn(SweepState), default=SweepState.QUEUED, index=True
    )
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    study_name: Mapped[str] = mapped_column(String(128), unique=True)
    code_dir: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    # The controller that owns the sweep: host + pid + heartbeat, so a resume can tell a live
    # controller from a dead one.
    controller_host: Mapped[str | None] = mapped_column(String(255), nullable=True)
    controller_pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # ... and its start (``START@BOOT``, tunehub_base.process_identity): pids are reused.
    controller_start: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # ... and where its tuner takes trials' reports, so another replica can route one to it.
    controller_url: Mapped[str | None] = mapped_column(Text, nullable=True)
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    best_trial_number: Mapped[int | None] = mapped_column(Integer, nullable=True)
    best_value: Mapped[float | None] = mapped_column(Float, nullable=True)
    model_version_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Why its trials start cold (seconds of imports each), or that warm-started ones still
    # imported packages themselves (naming them); None when they start fully warm.
    cold_start: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The submitting request's Idempotency-Key: the same request sent again (its first answer
    # lost) finds this sweep instead of making a second one. Unique per owner.
    request_key: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # Counters kept by the controller so listing a 10,000-trial sweep needs no scan.
    n_started: Mapped[int] = mapped_column(Integer, default=0)
    n_completed: Mapped[int] = mapped_column(Integer, default=0)
    n_pruned: Mapped[int] = mapped_column(Integer, default=0)
    n_failed: Mapped[int] = mapped_column(Integer, default=0)


class Trial(Base):
    __tablename__ = "tunehub_trials"
    __table_args__ = (
        UniqueConstraint("sweep_id", "number", name="uq_tunehub_trial_number"),
        Index("ix_tunehub_trials_sweep_state", "sweep_id", "state"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("tunehub_sweeps.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    optuna_trial_id: Mapped[int] = mapped_column(Integer)
    state: Mapped[TrialState] = mapped_column(StateColumn(TrialState), default=TrialState.PENDING)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    value: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # Attempts the GPU pool stopped for a notebook: not failures, so ``attempts - preemptions``
    # is what ``max_retries`` counts.
    preemptions: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    workdir: Mapped[str] = mapped_column(Text)
    log_path: Mapped[str | None] = mapped_column(Text, nullable=True)
    artifact_dir: Mapped[str | None] = mapped_column(Text, nullable=True)
    has_model: Mapped[bool] = mapped_column(default=False)
    # Every metric of its final report ({name: value}) and the serving figures tunehub
    # measured of its model (tuner.serving.cost); None when it reported one number only.
    metrics: Mapped[dict[str, float] | None] = mapped_column(JSON, nullable=True)
    token_hash: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)


class TrialReport(Base):
    """One intermediate value (``tuner.report(value, step)``); append-only, O(1) per report."""

    __tablename__ = "tunehub_trial_reports"
    __table_args__ = (UniqueConstraint("trial_id", "step", name="uq_tunehub_report_step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(
        ForeignKey("tunehub_trials.id", ondelete="CASCADE"), index=True
    )
    step: Mapped[int] = mapped_column(Integer)
    value: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class ModelVersion(Base):
    """A registered model version, with the lineage needed to reproduce it."""

    __tablename__ = "tunehub_model_versions"
    __table_args__ = (UniqueConstraint("model", "version", name="uq_tunehub_model_version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(String(64), index=True)
    version: Mapped[int] = mapped_column(Integer)
    owner: Mapped[str] = mapped_column(String(255), index=True)
    stage: Mapped[str | None] = mapped_column(String(16), nullable=True)
    path: Mapped[str] = mapped_column(Text)
    metric: Mapped[str] = mapped_column(String(128))
    direction: Mapped[str] = mapped_column(String(16))
    metric_value: Mapped[float | None] = mapped_column(Float, nullable=True)
    sweep_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    trial_number: Mapped[int | None] = mapped_column(Integer, nullable=True)
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    code_location: Mapped[str | None] = mapped_column(Text, nullable=True)
    data_path: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The metrics and serving figures it was chosen on (its trial's ``metrics``).
    metrics: Mapped[dict[str, float] | None] = mapped_column(JSON, nullable=True)
    # The content digest of the sweep's code snapshot (tuner.serving.lineage): "sha256:...".
    code_digest: Mapped[str | None] = mapped_column(String(80), nullable=True)
    # Every move between stages: [{"stage", "reason", "at"}], oldest first.
    history: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    promoted_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)


class ModelName(Base):
    """Who owns a model name (:mod:`tuner.serving.names`): claimed by the first sweep that
    names it in ``promote.model``, or the first registration, and kept."""

    __tablename__ = "tunehub_model_names"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(String(255), index=True)
    created_at: Mapped[datetime | None] = mapped_column(DateTime, default=utcnow, nullable=True)


class GpuHolding(Base):
    """A pod that held GPUs on Kubernetes (a trial attempt's or a notebook's), from its start
    to its end: the cluster's GPU-hours ledger (:mod:`tuner.pool_sources.kube_ledger`), the
    counterpart of the lock directory's ``ledger.jsonl`` on one machine. ``end`` is null while
    the pod holds them; ``stale``: its end was not seen (the pod vanished while no tuner
    watched), so the tuner closed it when it noticed. Times are seconds since the epoch, as
    in the ledger; one row per pod (its uid), however many tuners watch."""

    __tablename__ = "tunehub_gpu_holdings"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    pod_uid: Mapped[str] = mapped_column(String(64), unique=True)
    pod: Mapped[str] = mapped_column(String(253))
    person: Mapped[str] = mapped_column(String(255), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    server: Mapped[str | None] = mapped_column(String(255), nullable=True)
    sweep_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    trial: Mapped[int | None] = mapped_column(Integer, nullable=True)
    attempt: Mapped[int | None] = mapped_column(Integer, nullable=True)
    gpus: Mapped[int] = mapped_column(Integer)
    flavor: Mapped[str | None] = mapped_column(String(253), nullable=True)
    start: Mapped[float] = mapped_column(Float)
    end: Mapped[float | None] = mapped_column(Float, nullable=True, index=True)
    stale: Mapped[bool] = mapped_column(Boolean, default=False)
    #: GPU-seconds used (utilisation-weighted, summed over the pod's GPUs) as the pod measured
    #: them (:mod:`tuner.pool_sources.kube_use`; a notebook pod's from its server's reports to
    #: the hub, :mod:`tuner.pool_sources.kube_notebook_use`); 0 until a reading arrives.
    used_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    #: The pod's measured use so far, shaped like a holder record's ``use`` on one machine,
    #: with each GPU's latest reading under ``gpus``; null until measured.
    use: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    #: The hub groups the person was a member of when the pod started
    #: (:mod:`tuner.scheduling.hub_groups`): its GPU-hours count for them too; null when the
    #: tuner knew none (no hub token, or the hub did not answer yet).
    groups: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
