"""The Pareto front of a sweep that trades its metric against a cost (a multi-objective sweep,
or one with a promotion budget): what ``sweep.plot()`` draws, and what the Sweeps page draws
the same way (``tuner/web/sweeps.js``, ``drawPareto``).

The chart puts the primary metric on y and one cost on x (the first budgeted metric, else the
second objective), marks the trials on the front (no other trial is at least as good on both),
draws the budget as a line at its bound, and marks the model the budget chooses
(:func:`tuner.scheduling.budget.choose`, the rule promotion uses)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tuner.lifecycle.states import TrialState
from tuner.scheduling.budget import Candidate, choose, directions
from tuner.spec import SweepSpec


@dataclass(frozen=True)
class ParetoData:
    """What the chart shows: axes and their directions, the points, the front, the budget."""

    x: str
    y: str
    x_direction: str
    y_direction: str
    points: list[tuple[int, float, float]]  # (trial number, x, y)
    front: list[tuple[int, float, float]]  # the points on the front, along x
    bound: float | None  # the budget on x, if any
    chosen: int | None  # the trial the budget (or the primary metric alone) chooses


def axes(spec: SweepSpec) -> tuple[str, str] | None:
    """(x, y) of the chart, or None when the sweep has a single metric and no budget."""
    budget = spec.promote.constraints if spec.promote else {}
    costs = [m for m in budget if m != spec.metric]
    costs += [o.name for o in spec.objectives[1:]]
    return (costs[0], spec.metric) if costs else None


def front(points: Sequence[tuple[int, float, float]], x_direction: str,
          y_direction: str) -> list[tuple[int, float, float]]:
    """The non-dominated points, along x from its best end."""
    sx = 1.0 if x_direction == "minimize" else -1.0
    sy = 1.0 if y_direction == "minimize" else -1.0
    out: list[tuple[int, float, float]] = []
    best_y: float | None = None
    for p in sorted(points, key=lambda p: (sx * p[1], sy * p[2])):
        if best_y is None or sy * p[2] < best_y:
            out.append(p)
            best_y = sy * p[2]
    return out


def pareto_data(spec: SweepSpec, trials: Sequence[Mapping[str, Any]]) -> ParetoData | None:
    """The chart's data from the sweep's trials (the API's trial views), or None."""
    found = axes(spec)
    if found is None:
        return None
    x, y = found
    ways = directions(spec)
    points: list[tuple[int, float, float]] = []
    candidates: list[Candidate] = []
    for t in trials:
        if t.get("state") != TrialState.COMPLETED or t.get("value") is None:
            continue
        figures = {**(t.get("metrics") or {}), spec.metric: float(t["value"])}
        if x in figures:
            points.append((int(t["number"]), float(figures[x]), float(figures[y])))
        if t.get("has_model"):
            candidates.append(Candidate(int(t["number"]), float(t["value"]), figures))
    budget = dict(spec.promote.constraints) if spec.promote else {}
    chosen, _why = choose(candidates, budget, ways, spec.direction)
    return ParetoData(x, y, ways.get(x, "minimize"), spec.direction, points,
                      front(points, ways.get(x, "minimize"), spec.direction), budget.get(x),
                      chosen.trial_number if chosen else None)


def pareto_figure(data: ParetoData) -> Any:
    """A plotly figure of ``data``: every trial, the front, the budget line, the chosen one."""
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=[p[1] for p in data.points], y=[p[2] for p in data.points], mode="markers",
        name="trials", marker={"color": "#999", "size": 8},
        text=[f"trial {p[0]}" for p in data.points]))
    fig.add_trace(go.Scatter(
        x=[p[1] for p in data.front], y=[p[2] for p in data.front], mode="lines+markers",
        name="Pareto front", line={"color": "#1f77b4", "shape": "hv"},
        text=[f"trial {p[0]}" for p in data.front]))
    if data.bound is not None:
        fig.add_vline(x=data.bound, line_dash="dash", line_color="#d62728",
                      annotation_text=f"budget {data.x} {data.bound:g}")
    chosen = [p for p in data.points if p[0] == data.chosen]
    if chosen:
        fig.add_trace(go.Scatter(
            x=[chosen[0][1]], y=[chosen[0][2]], mode="markers",
            name=f"chosen: trial {chosen[0][0]}",
            marker={"color": "#2ca02c", "size": 16, "symbol": "star"}))
    fig.update_layout(title="Pareto front", xaxis_title=f"{data.x} ({data.x_direction})",
                      yaxis_title=f"{data.y} ({data.y_direction})")
    return fig
