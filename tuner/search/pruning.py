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


def hyperband_brackets(min_resource: float, max_resource: float, eta: float) -> int:
    """How many brackets Optuna's ``HyperbandPruner`` makes, by its own formula
    (``optuna/pruners/_hyperband.py``, ``_try_initialization``):
    ``floor(log_eta(max_resource / min_resource)) + 1``, floating point included (27 epochs at
    η = 3 are 4 brackets, 243 are 5: ``log(243, 3)`` is 4.999…, and Optuna does not round)."""
    return math.floor(math.log(max_resource / min_resource, eta)) + 1


def auto_max_resource(study: optuna.Study) -> int | None:
    """What Optuna's Hyperband takes for ``max_resource: auto``: the last step of the longest
    completed trial, plus one; None before any trial has completed (it prunes nothing then)."""
    steps = [t.last_step for t in study.get_trials(
        deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)) if t.last_step is not None]
    return max(steps) + 1 if steps else None


def _eta(options: dict[str, object]) -> float:
    factor = options.get("reduction_factor", 3)
    return float(factor) if isinstance(factor, int | float) else 3.0


def default_min_trials(
    kind: str, options: dict[str, object], max_resource: int | None = None
) -> int:
    """Enough trials at a step for the pruner's comparison to mean something: for successive
    halving, one reduction factor's worth per Hyperband bracket (the top 1/η of fewer than η
    trials is decided by one other trial); for the median, Optuna's own startup count.
    ``max_resource``: what ``max_resource: auto`` came to (:func:`auto_max_resource`); until
    it is known, one bracket is assumed (Hyperband prunes nothing then anyway)."""
    if kind == "median":
        return int(options.get("n_startup_trials", 5))  # type: ignore[call-overload]
    eta = _eta(options)
    brackets = 1
    low, high = options.get("min_resource", 1), options.get("max_resource", "auto")
    if high == "auto":
        high = max_resource
    if kind == "hyperband" and isinstance(low, int | float) and isinstance(high, int | float):
        brackets = max(1, hyperband_brackets(max(low, 1), max(high, low, 1), eta))
    return max(2, math.ceil(eta)) * brackets


class EnoughTrialsPruner(BasePruner):
    """Asks ``inner`` only when a step has enough trials to compare and is not the last."""

    def __init__(self, inner: BasePruner, min_trials: int, last_step: int | None = None,
                 auto_options: dict[str, object] | None = None) -> None:
        """``auto_options``: the options of a Hyperband pruner with ``max_resource: auto``
        whose ``min_trials`` is ours to derive: it depends on the bracket count, which Optuna
        fixes at the first completed trial, so it is derived again then, the same way."""
        self.inner = inner
        self.min_trials = min_trials
        self.last_step = last_step
        self._auto = auto_options
        # Steps up to this one are known to have enough trials (counts only grow).
        self._ready_up_to = 0

    def _derive(self, study: optuna.Study) -> None:
        assert self._auto is not None
        high = auto_max_resource(study)
        if high is not None:
            self.min_trials = default_min_trials("hyperband", self._auto, high)
            self._auto = None
            self._ready_up_to = 0  # judged against the old count

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        if self._auto is not None:
            self._derive(study)
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
