"""Bounded views of the study for TPE and for pruners, so that their cost per ask and per
report stops growing with the sweep.

TPE splits the finished trials into a "good" set (the best ``gamma(n)`` trials; Optuna's
default gamma caps it at 25) and a "bad" set (every other trial), fits a Parzen estimator to
each and proposes where good/bad is highest. Both estimators are built from every trial of the
study on every ask, so its cost grows linearly: about 1.5 ms at trial 100, 14 ms at trial
1,900 and over 100 ms at 10,000. The good set is already bounded; only the bad set grows, and
a density estimate of it does not need every point: a representative sample gives the same
shape.

:class:`BoundedTPE` wraps a sampler and hands it, instead of the study, a view of it holding:

- every trial TPE's split could put into the good set: the best ``BEST`` finished trials,
  ranked the way TPE ranks them (completed by value, then pruned by step reached and value);
- the most recent ``RECENT`` finished trials (TPE weighs the newest trials of the bad set the
  most, Optuna's ``default_weights``);
- a uniform reservoir sample of ``SAMPLE`` of all older finished trials;
- every running trial (constant liar treats them as bad).

The view holds at least ``RECENT + SAMPLE`` (288) finished trials, so ``gamma`` of its size is
the same 25 as for the whole history and the good set is exactly the one the whole history
gives; the bad set is the sample. Until the study has more than ``BEST + RECENT + SAMPLE``
finished trials the view is the whole study, so small sweeps sample exactly as before.

Pruners get the same treatment (:class:`BoundedPruner`): Optuna's median, successive-halving
and Hyperband pruners read every trial at each report; past ``PRUNE_SAMPLE`` finished trials
they are shown a uniform sample of that many and the running trials (their decisions are
quantiles of the trials' values at a step, which the sample estimates).

Optuna is used only through public API: the sampler's interface (``BaseSampler``; its
``before_trial``/``after_trial`` hooks keep the view's bookkeeping, a few numbers per trial,
never a scan of the history) and a storage (``BaseStorage``) that delegates everything to the
study's own storage except which trials ``get_all_trials`` returns. Trial ids are the study's,
so what TPE writes (constant liar's relative params on the current trial) lands on the real
trial.
"""

from __future__ import annotations

import bisect
import copy
import math
import random
from collections import deque
from collections.abc import Container, Iterable, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.pruners import BasePruner
from optuna.samplers import BaseSampler
from optuna.storages import BaseStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

#: Candidates for TPE's good set (its default gamma caps that set at 25 trials).
BEST = 32
#: The newest finished trials, kept whole: TPE gives them the most weight.
RECENT = 128
#: A uniform sample of the older finished trials.
SAMPLE = 160
#: Up to this many finished trials the view is the whole study.
BOUND = BEST + RECENT + SAMPLE

_RankKey = tuple[float, ...]


def rank_key(trial: FrozenTrial, state: TrialState, values: Sequence[float] | None,
             direction: StudyDirection) -> _RankKey | None:
    """Where TPE's single-objective split would place a finished trial (lower is better):
    completed trials by value first, then pruned ones by the last step they reached and their
    value there (``optuna.samplers._tpe.sampler._split_trials``). None: TPE ignores it."""
    sign = -1.0 if direction == StudyDirection.MAXIMIZE else 1.0
    if state == TrialState.COMPLETE and values:
        return (0.0, sign * values[0])
    if state == TrialState.PRUNED:
        if trial.intermediate_values:
            step, value = max(trial.intermediate_values.items())
            return (1.0, -step, math.inf if math.isnan(value) else sign * value)
        return (1.0, 1.0, 0.0)
    return None


class Reservoir:
    """A uniform sample of ``size`` trial numbers from a stream of them (Algorithm R): after
    ``n`` offers each offered number is in the sample with the same probability, ``size / n``.
    Both views sample with it: TPE's over the trials that left its recent window, the pruners'
    over every finished trial."""

    def __init__(self, size: int, seed: int | None) -> None:
        self.size = size
        self.numbers: list[int] = []
        self.offered = 0
        self._rng = random.Random(seed)

    def offer(self, number: int) -> None:
        self.offered += 1
        if len(self.numbers) < self.size:
            self.numbers.append(number)
            return
        slot = self._rng.randrange(self.offered)
        if slot < self.size:
            self.numbers[slot] = number


class TrialSelection:
    """Which finished trials the view keeps: the best, the newest, a reservoir sample of the
    rest. Bookkeeping of trial numbers only; each trial is added once, when it finishes."""

    def __init__(self, seed: int | None, best: int = BEST, recent: int = RECENT,
                 sample: int = SAMPLE) -> None:
        self.best_size = best
        self.best: list[tuple[_RankKey, int]] = []  # sorted, best first
        self.recent: deque[int] = deque(maxlen=recent)
        # fed the trials that leave the recent window
        self.reservoir = Reservoir(sample, seed)
        self.finished = 0
        self._numbers: list[int] | None = None

    @property
    def bound(self) -> int:
        return self.best_size + (self.recent.maxlen or 0) + self.reservoir.size

    def add(self, number: int, key: _RankKey) -> None:
        self.finished += 1
        self._numbers = None
        bisect.insort(self.best, (key, number))
        del self.best[self.best_size:]
        if len(self.recent) == self.recent.maxlen:
            self.reservoir.offer(self.recent[0])
        self.recent.append(number)

    def bounded(self) -> bool:
        """Whether the view is smaller than the history (else it is the whole study)."""
        return self.finished > self.bound

    def numbers(self) -> list[int]:
        """The kept finished trials' numbers, ascending."""
        if self._numbers is None:
            kept = {n for _, n in self.best}
            kept.update(self.recent)
            kept.update(self.reservoir.numbers)
            self._numbers = sorted(kept)
        return self._numbers


class ViewStorage(BaseStorage):
    """The study's storage, with ``get_all_trials`` limited to the selection and the running
    trials; every other call (reads of one trial, all writes) goes to the real storage with
    the real ids."""

    def __init__(self, base: BaseStorage, selection: TrialSelection | UniformSelection,
                 running: set[int]) -> None:
        self.base = base
        self.selection = selection
        self.running = running

    def get_all_trials(
        self, study_id: int, deepcopy: bool = True,
        states: Container[TrialState] | None = None,
    ) -> list[FrozenTrial]:
        if not self.selection.bounded():
            return self.base.get_all_trials(study_id, deepcopy=deepcopy, states=states)
        every = self.base.get_all_trials(study_id, deepcopy=False)
        numbers = sorted(set(self.selection.numbers()).union(
            n for n in self.running if n < len(every)))
        trials = [every[n] for n in numbers]
        if states is not None:
            trials = [t for t in trials if t.state in states]
        if deepcopy:
            trials = copy.deepcopy(trials)
        return trials

    # --- everything else is the real storage's ------------------------------------------

    def create_new_study(self, directions: Sequence[StudyDirection],
                         study_name: str | None = None) -> int:
        return self.base.create_new_study(directions, study_name)

    def delete_study(self, study_id: int) -> None:
        self.base.delete_study(study_id)

    def set_study_user_attr(self, study_id: int, key: str, value: Any) -> None:
        self.base.set_study_user_attr(study_id, key, value)

    def set_study_system_attr(self, study_id: int, key: str, value: Any) -> None:
        self.base.set_study_system_attr(study_id, key, value)

    def get_study_id_from_name(self, study_name: str) -> int:
        return self.base.get_study_id_from_name(study_name)

    def get_study_name_from_id(self, study_id: int) -> str:
        return self.base.get_study_name_from_id(study_id)

    def get_study_directions(self, study_id: int) -> list[StudyDirection]:
        return self.base.get_study_directions(study_id)

    def get_study_user_attrs(self, study_id: int) -> dict[str, Any]:
        return self.base.get_study_user_attrs(study_id)

    def get_study_system_attrs(self, study_id: int) -> dict[str, Any]:
        return self.base.get_study_system_attrs(study_id)

    def get_all_studies(self) -> list[Any]:  # Optuna's FrozenStudy (not exported)
        return self.base.get_all_studies()

    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        return self.base.create_new_trial(study_id, template_trial)

    def set_trial_param(self, trial_id: int, param_name: str, param_value_internal: float,
                        distribution: BaseDistribution) -> None:
        self.base.set_trial_param(trial_id, param_name, param_value_internal, distribution)

    def get_trial_id_from_study_id_trial_number(self, study_id: int, trial_number: int) -> int:
        return self.base.get_trial_id_from_study_id_trial_number(study_id, trial_number)

    def set_trial_state_values(self, trial_id: int, state: TrialState,
                               values: Sequence[float] | None = None) -> bool:
        return self.base.set_trial_state_values(trial_id, state, values)

    def set_trial_intermediate_value(self, trial_id: int, step: int,
                                     intermediate_value: float) -> None:
        self.base.set_trial_intermediate_value(trial_id, step, intermediate_value)

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        self.base.set_trial_user_attr(trial_id, key, value)

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        self.base.set_trial_system_attr(trial_id, key, value)

    def get_trial(self, trial_id: int) -> FrozenTrial:
        return self.base.get_trial(trial_id)


class BoundedTPE(BaseSampler):
    """``inner`` (a TPE sampler) sampling on a bounded view of the study; see the module
    docstring. One instance serves one study (the controller's in-memory one)."""

    def __init__(self, inner: BaseSampler, seed: int | None = None) -> None:
        self.inner = inner
        self.seed = seed
        self.selection = TrialSelection(seed)
        self.running: set[int] = set()
        self._storage: BaseStorage | None = None
        self._view: tuple[int, optuna.Study] | None = None  # (trial number, its view)

    def load(self, storage: BaseStorage, trials: Iterable[FrozenTrial],
             direction: StudyDirection) -> None:
        """Start on a study (built or rebuilt from the database: a new controller, a resume):
        its storage, whose trials the view hands out, and the bookkeeping of its trials,
        finished ones in order, running ones. Until then the sampler sees whole studies."""
        self._storage = storage
        self.selection = TrialSelection(self.seed)
        self.running = set()
        self._view = None
        for trial in trials:
            if trial.state in (TrialState.RUNNING, TrialState.WAITING):
                self.running.add(trial.number)
                continue
            key = rank_key(trial, trial.state, trial.values, direction)
            if key is not None:
                self.selection.add(trial.number, key)

    def _study_view(self, study: optuna.Study, trial: FrozenTrial) -> optuna.Study:
        """The view TPE samples trial ``trial`` on: one per trial, so Optuna's per-ask cache
        of the trial list lives as long as one ask, as it does on the real study."""
        if self._storage is None:
            return study  # not loaded (a study the mirror did not build): no view
        if self._view is None or self._view[0] != trial.number:
            storage = ViewStorage(self._storage, self.selection, self.running)
            view = optuna.load_study(study_name=study.study_name, storage=storage,
                                     sampler=self.inner, pruner=optuna.pruners.NopPruner())
            self._view = (trial.number, view)
        return self._view[1]

    # --- BaseSampler ---------------------------------------------------------------------

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return self.inner.infer_relative_search_space(self._study_view(study, trial), trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return self.inner.sample_relative(self._study_view(study, trial), trial, search_space)

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        return self.inner.sample_independent(
            self._study_view(study, trial), trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.running.add(trial.number)
        self.inner.before_trial(study, trial)

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self.running.discard(trial.number)
        key = rank_key(trial, state, values, study.direction)
        if key is not None:
            self.selection.add(trial.number, key)
        self.inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()


#: Finished trials a pruner compares with, at most (a uniform sample past that).
PRUNE_SAMPLE = 1000


class UniformSelection:
    """A uniform reservoir sample of the finished trials, for pruners: their decisions are
    quantiles (the median, the top 1/η of a rung) of the trials' values, which a uniform
    sample of a thousand estimates as well as all of them."""

    def __init__(self, seed: int | None, size: int = PRUNE_SAMPLE) -> None:
        self.reservoir = Reservoir(size, seed)
        self._numbers: list[int] | None = None

    @property
    def finished(self) -> int:
        return self.reservoir.offered

    def add(self, number: int) -> None:
        self._numbers = None
        self.reservoir.offer(number)

    def bounded(self) -> bool:
        return self.finished > self.reservoir.size

    def numbers(self) -> list[int]:
        if self._numbers is None:
            self._numbers = sorted(self.reservoir.numbers)
        return self._numbers


class BoundedPruner(BasePruner):
    """``inner`` deciding on a view of the study: a uniform sample of ``PRUNE_SAMPLE``
    finished trials and every running one, once the study has more finished trials than that
    (Optuna's median, successive-halving and Hyperband pruners read every trial of the study
    at each report: 7-11 ms per report at 5,000 trials). Up to then the whole study, exactly
    as before. Pruners have no hooks of their own: the study's owner (:mod:`tuner.search.mirror`)
    says which trials start and finish."""

    def __init__(self, inner: BasePruner, seed: int | None = None) -> None:
        self.inner = inner
        self.seed = seed
        self.selection = UniformSelection(seed)
        self.running: set[int] = set()
        self._storage: BaseStorage | None = None

    def load(self, storage: BaseStorage, trials: Iterable[FrozenTrial]) -> None:
        """Start on a study (built or rebuilt from the database): its storage and trials."""
        self._storage = storage
        self.selection = UniformSelection(self.seed)
        self.running = set()
        for trial in trials:
            if trial.state.is_finished():
                self.selection.add(trial.number)
            else:
                self.running.add(trial.number)

    def started(self, number: int) -> None:
        self.running.add(number)

    def finished(self, number: int) -> None:
        if number in self.running:
            self.running.discard(number)
            self.selection.add(number)

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        if self._storage is None or not self.selection.bounded():
            return self.inner.prune(study, trial)
        view = optuna.load_study(
            study_name=study.study_name, storage=ViewStorage(
                self._storage, self.selection, self.running),
            sampler=study.sampler, pruner=self.inner)
        return self.inner.prune(view, trial)
