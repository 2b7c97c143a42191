"""Search methods run on the search workloads, with the compute and time each spends.

Every method trains the same deterministic models (:mod:`benchmarks.search_workloads`), so a
configuration's learning curve is computed once per run and shared (:class:`Curves`): random
search and TPE's startup trials with the same seed propose the same points, and a pruned trial's
final value is known without training it again. What a method spends is only what it was shown:
the epochs it reported, and as time the measured training seconds of those epochs plus the real
seconds its sampler and pruner took.

Two ways of driving Optuna:

- :func:`run_controller`: the way tunehub's controller drives a sweep: ``parallelism`` trials in
  flight, each reporting an epoch at a time, the next trial asked when one ends; the study's
  sampler and pruner are the objects tunehub builds for the spec (``make_sampler``,
  ``make_pruner``). Time is simulated over ``parallelism`` workers, each epoch taking the
  seconds it took to train; tunehub's own per-trial overhead (process start, reports over HTTP)
  is not in it (measured separately: ``overhead`` and ``start_latency`` in RESULTS.md).
- :func:`run_optimize`: plain Optuna, ``study.optimize`` with its defaults, one trial at a time.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from benchmarks.search_workloads import EPOCHS, SPACE, Workload, train


class Curves:
    """Learning curves by configuration, trained on first use; with ``path``, also kept in a
    JSON-lines file shared by every process of a run (and runs after it: the training is
    deterministic, so a stored curve is the one training would produce again, with the
    seconds it took when it was trained)."""

    def __init__(self, workload: Workload, path: Path | None = None) -> None:
        self.workload = workload
        self.path = path
        self._known: dict[str, tuple[list[float], list[float]]] = {}
        self.trained = 0
        self._loaded = 0

    def _key(self, params: dict[str, Any]) -> str:
        return json.dumps(sorted(params.items()))

    def _load(self) -> None:
        if self.path is None or not self.path.exists():
            return
        with self.path.open() as f:
            f.seek(self._loaded)
            for line in f:
                if not line.endswith("\n"):
                    break  # another process is writing it
                self._loaded += len(line.encode())
                row = json.loads(line)
                self._known[row["key"]] = (row["values"], row["seconds"])

    def get(self, params: dict[str, Any]) -> tuple[list[float], list[float]]:
        key = self._key(params)
        if key not in self._known:
            self._load()
        if key not in self._known:
            values, seconds = train(self.workload, params)
            self._known[key] = (values, seconds)
            self.trained += 1
            if self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                line = json.dumps({"key": key, "values": values, "seconds": seconds}) + "\n"
                with self.path.open("a") as f:
                    f.write(line)  # one append of one line: whole lines for the readers
        return self._known[key]


def distributions() -> dict[str, Any]:
    from tuner.spec import SweepSpec

    return SweepSpec.from_dict({"name": "search", "command": "true", "metric": "value",
                                "space": SPACE}).distributions()


@dataclass
class Trace:
    """What one run did: every epoch report and every trial's end, on the run's clock."""

    reports: list[float] = field(default_factory=list)  # clock of each epoch report
    # (clock, final value or None if pruned, value it would have had at the end, epochs)
    ends: list[tuple[float, float | None, float, int]] = field(default_factory=list)
    search_s: float = 0.0  # real seconds in the sampler and pruner

    def summary(self, target: float, budget: int) -> dict[str, Any]:
        ends = sorted(self.ends)
        reports = sorted(self.reports)
        hit = next((c for c, v, _, _ in ends if v is not None and v >= target), None)
        out: dict[str, Any] = {
            "total_epochs": len(reports), "wall_s": max(reports, default=0.0),
            "search_s": self.search_s, "reached": hit is not None,
            "completed": sum(1 for e in ends if e[1] is not None),
            "pruned": sum(1 for e in ends if e[1] is None),
            "pruned_winners": sum(1 for e in ends if e[1] is None and e[2] >= target),
            "pruned_after_1": sum(1 for e in ends if e[1] is None and e[3] == 1),
            "best": max((v for _, v, _, _ in ends if v is not None), default=None),
        }
        if hit is not None:
            out["epochs"] = sum(1 for c in reports if c <= hit)
            out["seconds"] = hit
        # The best completed value once ``budget`` epochs have been spent (all trials).
        limit = reports[budget - 1] if len(reports) >= budget else float("inf")
        out["best_at_budget"] = max(
            (v for c, v, _, _ in ends if v is not None and c <= limit), default=None)
        return out


@dataclass
class _Running:
    trial: optuna.trial.Trial
    values: list[float]
    seconds: list[float]
    clock: float
    step: int = 0


def run_controller(study: optuna.Study, curves: Curves, trials: int, parallelism: int,
                   last_step: int = EPOCHS) -> Trace:
    """Drive ``study`` as tunehub's controller does (see the module's docstring)."""
    dists = distributions()
    trace = Trace()
    running: list[_Running] = []
    created = 0

    def start(clock: float) -> None:
        nonlocal created
        t0 = time.perf_counter()
        trial = study.ask(dists)
        spent = time.perf_counter() - t0
        trace.search_s += spent
        values, seconds = curves.get(trial.params)
        running.append(_Running(trial, values, seconds, clock + spent))
        created += 1

    while created < min(trials, parallelism):
        start(0.0)
    while running:
        r = min(running, key=lambda x: x.clock + x.seconds[x.step])
        r.clock += r.seconds[r.step]
        r.step += 1
        value = r.values[r.step - 1]
        trace.reports.append(r.clock)
        t0 = time.perf_counter()
        r.trial.report(value, r.step)
        pruned = r.step < last_step and r.trial.should_prune()
        if pruned:
            study.tell(r.trial, state=optuna.trial.TrialState.PRUNED)
        elif r.step >= last_step:
            study.tell(r.trial, value)
        spent = time.perf_counter() - t0
        trace.search_s += spent
        r.clock += spent
        if pruned or r.step >= last_step:
            trace.ends.append((r.clock, None if pruned else value, r.values[-1], r.step))
            running.remove(r)
            if created < trials:
                start(r.clock)
    return trace


def run_optimize(study: optuna.Study, curves: Curves, trials: int,
                 last_step: int = EPOCHS) -> Trace:
    """Plain Optuna: ``study.optimize`` on an objective that reports each epoch and raises
    ``TrialPruned`` when told to, one trial at a time (its documented pattern)."""
    trace = Trace()
    clock = 0.0
    dists = distributions()
    left = time.perf_counter()  # when the objective last returned: the rest is Optuna's

    def objective(trial: optuna.trial.Trial) -> float:
        nonlocal clock, left
        params = {name: _suggest(trial, name, d) for name, d in dists.items()}
        spent = time.perf_counter() - left  # the tell before, the ask and the suggestions
        trace.search_s += spent
        clock += spent
        values, seconds = curves.get(params)
        try:
            for step in range(1, last_step + 1):
                clock += seconds[step - 1]
                trace.reports.append(clock)
                t0 = time.perf_counter()
                trial.report(values[step - 1], step)
                pruned = step < last_step and trial.should_prune()
                spent = time.perf_counter() - t0
                trace.search_s += spent
                clock += spent
                if pruned:
                    trace.ends.append((clock, None, values[-1], step))
                    raise optuna.TrialPruned()
            trace.ends.append((clock, values[-1], values[-1], last_step))
            return values[-1]
        finally:
            left = time.perf_counter()

    study.optimize(objective, n_trials=trials)
    return trace


def _suggest(trial: optuna.trial.Trial, name: str, dist: Any) -> Any:
    """``trial.suggest_*`` for one of the space's distributions (the objective's own code)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    if isinstance(dist, FloatDistribution):
        return trial.suggest_float(name, dist.low, dist.high, log=dist.log)
    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(name, dist.choices)
    return trial.suggest_int(name, dist.low, dist.high, log=dist.log)


