"""Promotion under a budget: which models meet ``promote.constraints``, which is chosen, and,
when none does, which constraint failed and by how much (the sweep's reason says it).

A constraint bounds a metric the sweep has: the serving figures tunehub measures
(:mod:`tuner.serving.cost`, all to minimize: an upper bound) or one of its metrics (an upper
bound for a metric to minimize, a lower one for a metric to maximize). A model without the
figure (not measured) does not meet it: a budget is only met by a measurement.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tuner.search.ranking import is_better
from tuner.spec import SERVING_METRICS, SweepSpec


@dataclass(frozen=True)
class Candidate:
    """A model a sweep could promote: its trial, primary value and every figure it has."""

    trial_number: int
    value: float
    figures: Mapping[str, float]


@dataclass(frozen=True)
class Breach:
    """One constraint a model does not meet."""

    metric: str
    bound: float
    direction: str
    value: float | None  # None: not measured

    @property
    def over_by(self) -> float | None:
        if self.value is None:
            return None
        return self.value - self.bound if self.direction == "minimize" else self.bound - self.value

    def __str__(self) -> str:
        if self.value is None:
            return f"{self.metric} not measured"
        sign = ">" if self.direction == "minimize" else "<"
        return f"{self.metric} {self.value:.4g} {sign} {self.bound:.4g} (by {self.over_by:.4g})"


def directions(spec: SweepSpec) -> dict[str, str]:
    """The direction of every metric a constraint may name in this sweep."""
    found: dict[str, str] = dict(SERVING_METRICS)
    found.update({o.name: o.direction for o in spec.objectives})
    return found


def breaches(figures: Mapping[str, float], constraints: Mapping[str, float],
             ways: Mapping[str, str]) -> list[Breach]:
    """The constraints ``figures`` do not meet (empty: within budget)."""
    out = []
    for metric, bound in constraints.items():
        way = ways.get(metric, "minimize")
        value = figures.get(metric)
        ok = value is not None and (value <= bound if way == "minimize" else value >= bound)
        if not ok:
            out.append(Breach(metric, bound, way, value))
    return out


def budget_text(constraints: Mapping[str, float], ways: Mapping[str, str]) -> str:
    return ", ".join(f"{m} {'<=' if ways.get(m, 'minimize') == 'minimize' else '>='} {b:g}"
                     for m, b in constraints.items())


def choose(candidates: Sequence[Candidate], constraints: Mapping[str, float],
           ways: Mapping[str, str], direction: str) -> tuple[Candidate | None, str]:
    """The best candidate on the primary metric among those within budget, and a sentence:
    why it was chosen (how many were over budget), or why none was (for each constraint, how
    many models broke it and the nearest miss)."""
    within = [c for c in candidates if not breaches(c.figures, constraints, ways)]
    best: Candidate | None = None
    for c in within:
        if best is None or is_better(c.value, best.value, direction):
            best = c
    if best is not None:
        over = len(candidates) - len(within)
        return best, (f"best within the budget ({budget_text(constraints, ways)}); "
                      f"{over} of {len(candidates)} models over it")
    parts = []
    for metric in constraints:
        missed = [(b, c) for c in candidates
                  for b in breaches(c.figures, {metric: constraints[metric]}, ways)]
        if not missed:
            continue
        measured = [(b, c) for b, c in missed if b.over_by is not None]
        if measured:
            nearest, who = min(measured, key=lambda bc: bc[0].over_by or 0.0)
            parts.append(f"{metric}: {len(missed)} of {len(candidates)} over; nearest trial "
                         f"{who.trial_number} {nearest}")
        else:
            parts.append(f"{metric}: not measured for {len(missed)} of {len(candidates)}")
    return None, (f"no model meets the budget ({budget_text(constraints, ways)}): "
                  + "; ".join(parts))
