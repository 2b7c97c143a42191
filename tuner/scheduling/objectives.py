"""A finished trial's values for its study: one number, or one per objective of a
multi-objective sweep (``metrics:``), taken from what it reported and what tunehub measured of
its model. One place, so the controller's tell and a recovery's tell agree."""

from __future__ import annotations

from collections.abc import Mapping

from tuner.errors import TunehubError
from tuner.spec import SERVING_METRICS, SweepSpec


class BadReport(TunehubError, ValueError):
    """A trial's final report lacks what the sweep needs (the API answers 400 naming it)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def check_final_report(spec: SweepSpec, metrics: Mapping[str, float]) -> float:
    """The primary value of a final report of several metrics; every objective a trial
    reports (not the serving figures tunehub measures) must be in it."""
    for objective in spec.objectives:
        if objective.name not in metrics and objective.name not in SERVING_METRICS:
            raise BadReport("metrics", f"must include {objective.name!r}, one of the sweep's "
                                       f"metrics ({', '.join(o.name for o in spec.objectives)})")
    for name in metrics:
        if name in SERVING_METRICS:
            raise BadReport(f"metrics.{name}", "is measured by tunehub, not reported by trials")
    return float(metrics[spec.metric])


def objective_values(spec: SweepSpec, value: float | None,
                     figures: Mapping[str, float] | None) -> list[float] | None:
    """The values Optuna is told for a completed trial of a multi-objective sweep, in the
    order of its metrics; None for a one-metric sweep (it is told ``value``) or when one is
    missing (a model that was not measured: Optuna is then told the trial failed)."""
    if not spec.multi_objective:
        return None
    known = dict(figures or {})
    if value is not None:
        known.setdefault(spec.metric, value)
    try:
        return [float(known[o.name]) for o in spec.objectives]
    except KeyError:
        return None
