"""TPE on a bounded view of the study (tuner.search.sampling_view): exactly today's proposals while
the study is small, and past the bound a view that stays the same size yet holds TPE's whole good
set, the newest trials and the running ones; constant liar still writes to the real trial, and a
rebuilt (resumed) study gets the same view."""

from __future__ import annotations

from collections import deque
from typing import Any

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.samplers._tpe.sampler import default_gamma
from optuna.trial import FrozenTrial, TrialState

from tuner.search.sampling_view import (
    BEST,
    BOUND,
    PRUNE_SAMPLE,
    RECENT,
    SAMPLE,
    BoundedPruner,
    BoundedTPE,
)

DISTS = {"x": FloatDistribution(0.0, 1.0), "y": FloatDistribution(0.0, 1.0)}


def objective(params: dict[str, Any]) -> float:
    return (params["x"] - 0.3) ** 2 + (params["y"] - 0.6) ** 2


class RecordingTPE(optuna.samplers.TPESampler):
    """TPE that notes the trials it was shown for each proposal."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed=seed, constant_liar=True, multivariate=True)
        self.seen: list[list[FrozenTrial]] = []

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, Any]) -> dict[str, Any]:
        self.seen.append(study.get_trials(deepcopy=False))
        return super().sample_relative(study, trial, search_space)


def new_study(sampler: optuna.samplers.BaseSampler) -> optuna.Study:
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage, sampler=sampler)
    if isinstance(sampler, BoundedTPE):
        sampler.load(storage, [], study.direction)
    return study


def play(study: optuna.Study, n: int, parallelism: int = 4) -> list[dict[str, Any]]:
    """``n`` asks with ``parallelism`` trials in flight (the oldest told first), as the
    controller does; every fifth trial pruned at its second step."""
    proposals = []
    flight: deque[optuna.Trial] = deque()
    for _ in range(n):
        trial = study.ask(DISTS)
        proposals.append(dict(trial.params))
        flight.append(trial)
        if len(flight) == parallelism:
            done = flight.popleft()
            value = objective(done.params)
            if done.number % 5 == 4:
                done.report(value + 1.0, 1)
                done.report(value + 0.5, 2)
                study.tell(done, state=TrialState.PRUNED)
            else:
                study.tell(done, value)
    return proposals


def test_a_small_study_samples_exactly_as_plain_tpe() -> None:
    """Up to BOUND finished trials the view is the whole study: the same proposals, one by
    one, as TPE on the study itself."""
    plain = play(new_study(optuna.samplers.TPESampler(
        seed=7, constant_liar=True, multivariate=True)), 60)
    bounded = play(new_study(BoundedTPE(optuna.samplers.TPESampler(
        seed=7, constant_liar=True, multivariate=True), seed=7)), 60)
    assert bounded == plain


def _good_set(trials: list[FrozenTrial]) -> set[int]:
    """TPE's good set for these trials (single objective, minimize, default gamma)."""
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    n_below = default_gamma(len(finished))
    complete = sorted((t for t in finished if t.state == TrialState.COMPLETE),
                      key=lambda t: t.value)
    return {t.number for t in complete[:n_below]}


@pytest.fixture(scope="module")
def long_run() -> tuple[RecordingTPE, optuna.Study]:
    inner = RecordingTPE(seed=3)
    study = new_study(BoundedTPE(inner, seed=3))
    play(study, BOUND + 200)
    return inner, study


def look(inner: RecordingTPE, study: optuna.Study) -> tuple[list[FrozenTrial],
                                                             list[FrozenTrial]]:
    """One more proposal: what TPE was shown for it, and the whole study at that moment."""
    trial = study.ask(DISTS)
    seen, everything = inner.seen[-1], study.get_trials(deepcopy=False)
    study.tell(trial, objective(trial.params))
    return seen, everything[:trial.number]


def test_the_view_stops_growing_and_keeps_the_good_set(
    long_run: tuple[RecordingTPE, optuna.Study],
) -> None:
    inner, study = long_run
    last_seen, everything = look(inner, study)
    # What TPE read for the last proposal: bounded, not the whole history.
    assert len(everything) >= BOUND + 200
    assert len(last_seen) <= BEST + RECENT + SAMPLE + 4
    assert len(last_seen) < len(everything) - 150
    sizes = [len(seen) for seen in inner.seen[-150:]]
    assert max(sizes) - min(sizes) <= BEST + 4  # flat, not growing by one per trial
    # Its good set is the whole history's (gamma of the view's size is the same cap).
    finished_seen = [t for t in last_seen if t.state.is_finished()]
    assert default_gamma(len(finished_seen)) == default_gamma(len(everything)) == 25
    assert _good_set(last_seen) == _good_set(everything)
    # The newest finished trials and every running one are in it.
    numbers = {t.number for t in last_seen}
    finished = [t.number for t in everything if t.state.is_finished()]
    assert set(finished[-RECENT:]) <= numbers
    running = {t.number for t in everything if t.state == TrialState.RUNNING}
    assert running and running <= numbers


def test_constant_liar_writes_to_the_real_trial(
    long_run: tuple[RecordingTPE, optuna.Study],
) -> None:
    """TPE shares a running trial's relative params through its system attributes; on the
    view they land on the study's own trial (same ids), where the next ask reads them."""
    _, study = long_run
    trial = study.ask(DISTS)
    frozen = study.get_trials(deepcopy=False)[trial.number]
    assert any(key.startswith("tpe:relative_params") for key in frozen.system_attrs)
    study.tell(trial, objective(trial.params))


def test_a_rebuilt_study_gets_the_same_view(
    long_run: tuple[RecordingTPE, optuna.Study],
) -> None:
    """A resumed controller rebuilds the study from the database: ``load`` makes the view from
    its trials (the same good set and newest trials, a reservoir of the same size)."""
    _, original = long_run
    trials = original.get_trials(deepcopy=False)
    inner = RecordingTPE(seed=5)
    sampler = BoundedTPE(inner, seed=5)
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage, sampler=sampler)
    study.add_trials(trials)
    sampler.load(storage, study.get_trials(deepcopy=False), study.direction)
    study.ask(DISTS)
    seen = inner.seen[-1]
    assert len(seen) <= BEST + RECENT + SAMPLE + 4
    assert _good_set(seen) == _good_set(trials)
    finished = [t.number for t in trials if t.state.is_finished()]
    assert set(finished[-RECENT:]) <= {t.number for t in seen}


def test_the_sample_of_older_trials_is_spread_over_the_history(
    long_run: tuple[RecordingTPE, optuna.Study],
) -> None:
    """The reservoir is uniform over the trials older than the newest: not only the first
    ones, not only the last."""
    inner, study = long_run
    last_seen, everything = look(inner, study)
    seen = {t.number for t in last_seen if t.state.is_finished()}
    n = len(everything)
    older = sorted(x for x in seen if x < n - RECENT - 10)
    assert len(older) >= SAMPLE // 2
    halves = sum(1 for x in older if x < (n - RECENT) / 2), sum(
        1 for x in older if x >= (n - RECENT) / 2)
    assert min(halves) >= len(older) / 4


class RecordingMedian(optuna.pruners.MedianPruner):
    """The median pruner, noting how many trials it was shown per decision."""

    def __init__(self) -> None:
        super().__init__(n_startup_trials=5, n_warmup_steps=0)
        self.shown: list[int] = []

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        self.shown.append(len(study.get_trials(deepcopy=False)))
        return super().prune(study, trial)


def test_a_pruner_decides_on_a_bounded_uniform_sample() -> None:
    """Past PRUNE_SAMPLE finished trials the median pruner is shown a sample of that size
    (and the running trials), not the growing study, and still prunes what is clearly below
    the median and keeps what is clearly above it."""
    inner = RecordingMedian()
    pruner = BoundedPruner(inner, seed=1)
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage, pruner=pruner, direction="maximize",
                                sampler=optuna.samplers.RandomSampler(seed=1))
    pruner.load(storage, [])

    def one(value: float) -> bool:
        trial = study.ask(DISTS)
        pruner.started(trial.number)
        trial.report(value, 1)
        pruned = trial.should_prune()
        study.tell(trial, value)
        pruner.finished(trial.number)
        return pruned

    for i in range(PRUNE_SAMPLE + 300):
        one((i * 7919 % 1000) / 1000)  # values spread evenly over [0, 1)
    assert inner.shown[PRUNE_SAMPLE - 10] == PRUNE_SAMPLE - 9  # the whole study, up to then
    assert max(inner.shown[-250:]) <= PRUNE_SAMPLE + 1
    assert one(0.2) and one(0.3)  # clearly below the median (0.5)
    assert not one(0.7) and not one(0.8)
