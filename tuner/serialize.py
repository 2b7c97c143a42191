"""JSON views of sweeps, trials and model versions: one shape for the CLI's ``--json`` and the
REST API."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from tuner.db import ModelVersion, SweepRow, Trial
from tuner.lifecycle.states import COUNTED, counter_column

if TYPE_CHECKING:
    from tuner.sweep_store import Actor, SweepStore


def _time(value: datetime | None) -> str | None:
    return value.isoformat() + "Z" if value is not None else None


def sweep_view(sweep: SweepRow) -> dict[str, Any]:
    spec = sweep.spec or {}
    return {
        "id": sweep.id,
        "name": sweep.name,
        "owner": sweep.owner,
        "state": sweep.state,
        "reason": sweep.reason,
        "backend": sweep.backend,
        "metric": spec.get("metric"),
        "direction": spec.get("direction"),
        "trials": spec.get("trials"),
        "parallelism": spec.get("parallelism"),
        # Counters of trials by their finished state, under the state's name.
        **{state: getattr(sweep, counter_column(state)) for state in COUNTED},
        "best_value": sweep.best_value,
        "best_trial": sweep.best_trial_number,
        "model_version_id": sweep.model_version_id,
        "cold_start": sweep.cold_start,
        "created_at": _time(sweep.created_at),
        "started_at": _time(sweep.started_at),
        "finished_at": _time(sweep.finished_at),
        "spec": spec,
    }


def trial_view(trial: Trial, reports: list[tuple[int, float]] | None = None) -> dict[str, Any]:
    duration = None
    if trial.started_at and trial.finished_at:
        duration = (trial.finished_at - trial.started_at).total_seconds()
    view: dict[str, Any] = {
        "number": trial.number,
        "state": trial.state,
        "value": trial.value,
        "params": trial.params,
        "attempts": trial.attempts,
        "preemptions": trial.preemptions,
        "reason": trial.reason,
        "last_step": trial.last_step,
        "has_model": trial.has_model,
        "metrics": trial.metrics,
        "started_at": _time(trial.started_at),
        "finished_at": _time(trial.finished_at),
        "duration_seconds": duration,
    }
    if reports is not None:
        view["intermediate_values"] = [{"step": s, "value": v} for s, v in reports]
    return view


def model_version_view(mv: ModelVersion) -> dict[str, Any]:
    return {
        "model": mv.model,
        "version": mv.version,
        "owner": mv.owner,
        "stage": mv.stage,
        "path": mv.path,
        "metric": mv.metric,
        "direction": mv.direction,
        "metric_value": mv.metric_value,
        "metrics": mv.metrics,
        "history": mv.history or [],
        "code_digest": mv.code_digest,
        "sweep_id": mv.sweep_id,
        "trial_number": mv.trial_number,
        "params": mv.params,
        "code_location": mv.code_location,
        "data_path": mv.data_path,
        "created_at": _time(mv.created_at),
        "promoted_at": _time(mv.promoted_at),
    }


def trials_view(store: SweepStore, sweep_id: int, actor: Actor) -> list[dict[str, Any]]:
    """A sweep's trials as the API and the CLI show them, each with its reports and its
    measured GPU use on this machine (``gpu_use``: null for a trial that held no GPU here)."""
    from tuner.pool_view import trials_gpu_use

    reports = store.reports(sweep_id, actor)
    trials = store.trials(sweep_id, actor)  # first: it checks the actor may see the sweep
    try:
        gpu_use = trials_gpu_use(store.settings.gpu_locks_dir, sweep_id)
    except OSError:  # the pool's records unreadable here: the figures are absent
        gpu_use = {}
    return [{**trial_view(t, reports.get(t.number, [])), "gpu_use": gpu_use.get(t.number)}
            for t in trials]
