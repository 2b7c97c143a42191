"""A completed sweep's model: the best trial that saved one (within ``promote.constraints``,
:mod:`tuner.scheduling.budget`) becomes a model version, and the sweep's ``promote`` policy
decides whether it goes to production. What happened is said in the
sweep's reason (``sweep show``, the sweeps page)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import select

from tunehub_base.settings import Settings
from tuner.db import Database, ModelVersion, Trial
from tuner.errors import TunehubError
from tuner.lifecycle.ledger import Ledger
from tuner.lifecycle.states import TrialState
from tuner.scheduling.budget import Candidate, breaches, choose, directions
from tuner.spec import Promote, SweepSpec

if TYPE_CHECKING:
    from tuner.serving.registry import Registry

log = logging.getLogger("tunehub.promotion")


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


def candidates(db: Database, sweep_id: int, metric: str) -> list[Candidate]:
    """Every completed trial of the sweep that saved a model, with its figures (what it
    reported, what tunehub measured of its model, and its primary value as ``metric``)."""
    with db.session() as s:
        rows = s.scalars(
            select(Trial).where(
                Trial.sweep_id == sweep_id,
                Trial.state == TrialState.COMPLETED,
                Trial.has_model.is_(True),
                Trial.value.is_not(None),
            ).order_by(Trial.number)
        ).all()
        return [Candidate(r.number, float(r.value or 0.0),
                          {**(r.metrics or {}), metric: float(r.value or 0.0)}) for r in rows]


def _trial(db: Database, sweep_id: int, number: int) -> Trial | None:
    with db.session() as s:
        return s.scalar(select(Trial).where(Trial.sweep_id == sweep_id, Trial.number == number))


def register_best(
    ledger: Ledger, settings: Settings, registry: Registry | None, origin: SweepOrigin,
    promote: Promote,
) -> None:
    """Register the sweep's best model (within ``promote.constraints`` when it has some) and
    apply its policy; never raises for what the user can fix (a model name taken meanwhile):
    the sweep's reason says it instead."""
    from tuner.serving.registry import Registry

    spec = origin.spec
    chosen_why = ""
    if promote.constraints:
        ways = directions(spec)
        chosen, chosen_why = choose(candidates(ledger.db, origin.sweep_id, spec.metric),
                                    promote.constraints,
                                    ways, spec.direction)
        if chosen is None:
            log.info("sweep %s: nothing promoted: %s", origin.sweep_id, chosen_why)
            ledger.note(origin.sweep_id, f"nothing promoted: {chosen_why}")
            return
        best = _trial(ledger.db, origin.sweep_id, chosen.trial_number)
    else:
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
            metrics=dict(best.metrics or {}),
            code_digest=_code_digest(origin, settings),
        )
    except TunehubError as exc:  # e.g. the model name was taken while the sweep ran
        ledger.note(origin.sweep_id, f"model not registered: {exc}")
        return
    promoted, why = _apply(registry, version, promote, directions(spec))
    text = _outcome(version, promoted, why, promote.stage)
    if chosen_why:
        text += f" (trial {best.number}: {chosen_why})"
    log.info("sweep %s: %s", origin.sweep_id, text)
    ledger.note(origin.sweep_id, text, model_version_id=version.id)


def _code_digest(origin: SweepOrigin, settings: Settings) -> str | None:
    """The code snapshot's content digest for the version's lineage; None (logged) when the
    sweep has no snapshot or it cannot be walked."""
    if origin.code_dir is None:
        return None
    from tuner.serving.lineage import tree_digest

    try:
        return tree_digest(origin.code_dir, settings.sweeps_dir)
    except (TunehubError, OSError) as exc:
        log.warning("sweep %s: no code digest: %s", origin.sweep_id, exc)
        return None


def _apply(registry: Registry, version: ModelVersion, promote: Promote,
           ways: dict[str, str]) -> tuple[bool, str]:
    """The policy, with "if better" judged under the same budget: a production version that
    breaks it (or was never measured against it) does not stand in the new one's way."""
    if promote.constraints and promote.policy == "if-better":
        current = registry.at_stage(version.model, "production")
        if current is not None and current.id != version.id:
            figures = dict(current.metrics or {})
            if current.metric_value is not None:
                figures.setdefault(current.metric, current.metric_value)
            over = breaches(figures, promote.constraints, ways)
            if over:
                why = (f"production v{current.version} is over the budget: "
                       + "; ".join(str(b) for b in over))
                registry.promote(version.model, version.version, promote.stage, is_admin=True,
                                 reason=f"sweep {version.sweep_id}, policy if-better: {why}")
                return True, why
    return registry.apply_policy(version, promote.policy, promote.stage)


def _outcome(version: ModelVersion, promoted: bool, why: str, stage: str = "production") -> str:
    return (
        f"{version.model} v{version.version} "
        + (f"promoted to {stage}" if promoted else "registered, not promoted")
        + (f": {why}" if why else "")
    )
