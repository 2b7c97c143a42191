"""Pruning that suits the sweep sizes people launch from a notebook.

Optuna's pruners decide from whatever is there: Hyperband's successive halving compares a trial
with the trials of its bracket that reached the same rung, even when that is a single earlier
trial, so in a six-trial sweep most trials are stopped at step 1 on a coin toss. Two rules are
laid over every pruner (through Optuna's public ``BasePruner`` interface):

- no decision at a step until ``min_trials`` other trials have reported at that step;
- never a decision at or after the trial's last step (a trial that trained to the end is a
  result, not a pruned trial).
"""

from __future__ import annotations

import math

import optuna
from optuna.pruners import BasePruner

_COUNTED = (
    optuna.trial.TrialState.COMPLETE,
    optuna.trial.TrialState.PRUNED,
    optuna.trial.TrialState.RUNNING,
)


def default_min_trials(kind: str, options: dict[str, object]) -> int:
    """Enough trials at a step for the pruner's comparison to mean something: for successive
    halving, one reduction factor's worth per Hyperband bracket (the top 1/η of fewer than η
    trials is decided by one other trial); for the median, Optuna's own startup count."""
    if kind == "median":
        return int(options.get("n_startup_trials", 5))  # type: ignore[call-overload]
    factor = options.get("reduction_factor", 3)
    eta = float(factor) if isinstance(factor, int | float) else 3.0
    brackets = 1
    low, high = options.get("min_resource", 1), options.get("max_resource")
    if kind == "hyperband" and isinstance(low, int | float) and isinstance(high, int | float):
        brackets = max(1, math.floor(math.log(max(high / max(low, 1), 1), eta) + 1e-9) + 1)
    elif kind == "hyperband":
        brackets = 3  # max_resource "auto": Optuna's usual count for a few dozen epochs
    return max(2, math.ceil(eta)) * brackets


class EnoughTrialsPruner(BasePruner):
    """Asks ``inner`` only when a step has enough trials to compare and is not the last."""

    def __init__(self, inner: BasePruner, min_trials: int, last_step: int | None = None) -> None:
        self.inner = inner
        self.min_trials = min_trials
        self.last_step = last_step
        # Steps up to this one are known to have enough trials (counts only grow).
        self._ready_up_to = 0

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        step = trial.last_step
        if step is None:
            return False
        if self.last_step is not None and step >= self.last_step:
            return False
        if step > self._ready_up_to:
            others = sum(
                1
                for t in study.get_trials(deepcopy=False, states=_COUNTED)
                if t.number != trial.number and step in t.intermediate_values
            )
            if others < self.min_trials:
                return False
            self._ready_up_to = step
        return self.inner.prune(study, trial)
