"""A completed sweep's model: the best trial that saved one becomes a model version, and the
sweep's ``promote`` policy decides whether it goes to production. What happened is said in the
sweep's reason (``sweep show``, the sweeps page)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import select

from tunehub_base.settings import Settings
from tuner.db import Database, ModelVersion, Trial
from tuner.errors import TunehubError
from tuner.lifecycle.ledger import Ledger
from tuner.lifecycle.states import TrialState
from tuner.spec import Promote, SweepSpec

if TYPE_CHECKING:
    from tuner.serving.registry import Registry


@dataclass(frozen=True)
class SweepOrigin:
    """The sweep a model comes from: its lineage in the registry."""

    sweep_id: int
    owner: str
    spec: SweepSpec
    code_dir: Path | None


def best_trial_with_model(db: Database, sweep_id: int, direction: str) -> Trial | None:
    """The best completed trial that saved a model (``tuner.save_model``), if any."""
    order = Trial.value.desc() if direction == "maximize" else Trial.value.asc()
    with db.session() as s:
        return s.scalar(
            select(Trial)
            .where(
                Trial.sweep_id == sweep_id,
                Trial.state == TrialState.COMPLETED,
                Trial.has_model.is_(True),
            )
            .order_by(order)
            .limit(1)
        )


def register_best(
    ledger: Ledger, settings: Settings, registry: Registry | None, origin: SweepOrigin,
    promote: Promote,
) -> None:
    """Register the sweep's best model and apply its policy; never raises for what the user
    can fix (a model name taken meanwhile): the sweep's reason says it instead."""
    from tuner.serving.registry import Registry

    spec = origin.spec
    best = best_trial_with_model(ledger.db, origin.sweep_id, spec.direction)
    if best is None:
        ledger.note(origin.sweep_id,
                    "no completed trial saved a model (tuner.save_model); nothing registered")
        return
    registry = registry or Registry(ledger.db, settings.registry, settings.serving_root)
    try:
        version = registry.register(
            model=promote.model,
            source_dir=Path(best.artifact_dir or "") / "model",
            owner=origin.owner,
            metric=spec.metric,
            direction=spec.direction,
            metric_value=best.value,
            sweep_id=origin.sweep_id,
            trial_number=best.number,
            params=dict(best.params),
            code_location=str(origin.code_dir) if origin.code_dir else None,
            data_path=str(settings.data),
            # The sweep's own directory may be shared with its trials (a pod's mount): only
            # the directory of all sweeps is the platform's alone.
            trusted=settings.sweeps_dir,
        )
    except TunehubError as exc:  # e.g. the model name was taken while the sweep ran
        ledger.note(origin.sweep_id, f"model not registered: {exc}")
        return
    promoted, why = registry.apply_policy(version, promote.policy)
    ledger.note(origin.sweep_id, _outcome(version, promoted, why), model_version_id=version.id)


def _outcome(version: ModelVersion, promoted: bool, why: str) -> str:
    return (
        f"{version.model} v{version.version} "
        + ("promoted to production" if promoted else "registered, not promoted")
        + (f": {why}" if why else "")
    )
