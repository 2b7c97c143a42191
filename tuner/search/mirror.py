"""The study kept in memory beside the database: the controller's sampler and pruner read it.

A sweep's controller is its study's only writer, so it can hold the study's history in memory
instead of reading it back from the database on every ask (Optuna's RDB storage reads every
trial of the study per ``ask``, which makes a 10,000-trial sweep ten times slower per trial
than a 100-trial one). :class:`StudyMirror` is an Optuna study on ``InMemoryStorage`` with the
sweep's sampler and pruner, built from the database once (on load and on resume), and kept in
step with it on every ask, report and tell. Every write still goes to the database study
through Optuna's API, so the database stays the source of truth: a resumed controller,
optuna-dashboard and the notebook's plots read it.

Trial numbers are the same in both: each trial is created in memory first (the sampler
proposes it there) and then in the database with the same number, params, distributions and
attributes. If the numbers ever disagree (something else wrote to the study), the mirror is
rebuilt from the database rather than trusted.

The controller asks in a worker thread (sampling and the database insert overlap the running
trials without holding up its event loop) while reports and tells arrive on the loop: every
call that reads or changes the memory study holds :attr:`StudyMirror.lock`, so the sampler never
sees a study changing under it. No write to the database is made holding that lock: a
controller waits a database outage out inside its write (:mod:`tuner.db.outage`), and the
trials' reports, which take the lock on the event loop, must be answered meanwhile (503), not
stall the whole service behind it. Asks write their trials one at a time
(:attr:`StudyMirror._asking`), so the database numbers them in the memory study's order.

Optuna is used through ``Study.ask``/``tell``/``add_trials``, and for what ``Study`` does not offer
(the trial id a new trial gets, a parameter completed after a crash) through trial handles and the
storages' ``BaseStorage`` methods: the seams :mod:`tuner.search.optuna_adapter` lists and its canary
test pins.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.exceptions import UpdateFinishedTrialError
from optuna.pruners import BasePruner
from optuna.samplers import BaseSampler
from optuna.storages import BaseStorage, InMemoryStorage, RDBStorage
from optuna.trial import FrozenTrial, TrialState

from tuner.db.outage import DatabaseUnavailable, patient
from tuner.search.optuna_adapter import create_trial_once, trial_for
from tuner.search.pruning import EnoughTrialsPruner
from tuner.search.sampling_view import BoundedPruner, BoundedTPE
from tuner.search.study import complete_params, make_pruner, make_sampler, storage_for
from tuner.spec import SweepSpec

log = logging.getLogger("tunehub.mirror")


@dataclass(frozen=True)
class Asked:
    """A new trial, created in memory and in the database: its number, its id in the database
    (tunehub's trial row keeps it) and its parameters."""

    number: int
    trial_id: int
    params: dict[str, Any]


class MirroredTrial:
    """A running trial's reports go to both studies; the pruner decides on the memory one.

    The memory study's :class:`optuna.trial.Trial` checks and records a report (Optuna ignores
    a step reported twice) at once; the database study gets the same value from the caller,
    in a group commit with other trials' reports (:mod:`tuner.scheduling.report_writer`), not
    through a second ``Trial`` that would first read the whole trial back, and with no lock
    held while it commits. The memory trial is made on first use: a trial that never reports
    an intermediate value costs nothing here."""

    def __init__(self, mirror: StudyMirror, number: int, trial_id: int) -> None:
        self.mirror = mirror
        self.number = number
        self.trial_id = trial_id
        self._memory: optuna.trial.Trial | None = None
        self._steps: set[int] = set()  # steps the trial has a value for, in both studies
        self._in_memory: set[int] = set()  # steps reported to the memory study by this trial

    def _trial(self) -> optuna.trial.Trial:
        if self._memory is None:
            self._memory = self.mirror.memory_trial(self.number)
            self._steps = set(self.mirror.memory_frozen(self.number).intermediate_values)
            self._in_memory = set(self._steps)
        return self._memory

    def report(self, value: float, step: int) -> bool:
        """Report to the memory study; returns whether the database study still needs the
        step (the caller writes it there, then calls :meth:`written`)."""
        with self.mirror.lock:
            memory = self._trial()
            if step in self._steps:
                # Optuna keeps the first value of a step, in both studies. A rerun attempt
                # (a retry, or a rerun after its controller died) repeats its steps: drop
                # them here, before Optuna's warning for each lands in the controller's log.
                return False
            if step not in self._in_memory:
                memory.report(value, step)
                self._in_memory.add(step)
            # A write lost to a database outage leaves the memory study holding the step:
            # the report, sent again, is written then.
            return True

    def written(self, step: int) -> None:
        """The database study holds ``step`` now."""
        with self.mirror.lock:
            self._steps.add(step)

    def should_prune(self) -> bool:
        with self.mirror.lock:
            return self._trial().should_prune()


class StudyMirror:
    """The sweep's study: sampler and pruner on an in-memory copy, writes to both copies."""

    def __init__(
        self, spec: SweepSpec, study_name: str, url: str, sampler: BaseSampler | None = None
    ) -> None:
        """``sampler``: the spec's unless given (a test's recording sampler)."""
        # Held by every call that reads or changes the memory study (see the module
        # docstring), never across a database write.
        self.lock = threading.RLock()
        # Held by an ask from its sample to its database insert: one ask at a time, so the
        # database numbers trials as the memory study did. (Taken before ``lock``, never
        # while holding it.)
        self._asking = threading.Lock()
        self._storage: RDBStorage = storage_for(url)
        # The database study only records: its sampler is never asked for a suggestion
        # (``tell`` calls ``after_trial`` on it, which must cost nothing).
        self.db = optuna.load_study(
            study_name=study_name,
            storage=self._storage,
            sampler=optuna.samplers.RandomSampler(),
            pruner=optuna.pruners.NopPruner(),
        )
        self._db_study_id = self._storage.get_study_id_from_name(study_name)
        # TPE samples on a bounded view of the study (tuner.search.sampling_view): its cost per ask
        # stops growing with the sweep.
        # (Multi-objective: Optuna's own sampler on the whole study; the view ranks one value.)
        self.sampler = sampler or (make_sampler(spec) if spec.multi_objective
                                   else bounded(make_sampler(spec), spec.seed))
        self.pruner = make_pruner(spec)
        # The pruner decides on a bounded sample of the study once it is large.
        self._pruner_view = bounded_pruner(self.pruner, spec.seed)
        self.memory: optuna.Study
        self._memory_storage: InMemoryStorage
        self._memory_study_id = 0
        self._db_ids: dict[int, int] = {}  # trial number -> its id in the database
        self.rebuild()

    # --- building ------------------------------------------------------------------------

    def rebuild(self) -> None:
        """Read the database study once and make the memory study equal to it."""
        with self.lock:
            trials = self._storage.get_all_trials(self._db_study_id, deepcopy=False)
            self._db_ids = {}
            self._memory_storage = InMemoryStorage()
            self.memory = optuna.create_study(
                storage=self._memory_storage,
                sampler=self.sampler,
                pruner=self.pruner,
                directions=self.db.directions,
            )
            self._memory_study_id = self._memory_storage.get_study_id_from_name(
                self.memory.study_name
            )
            self.memory.add_trials(trials)
            if isinstance(self.sampler, BoundedTPE):
                self.sampler.load(self._memory_storage, trials, self.memory.direction)
            if self._pruner_view is not None:
                self._pruner_view.load(self._memory_storage, trials)
            log.debug("study %s mirrored: %d trials", self.db.study_name, len(trials))

    # --- the controller's calls ----------------------------------------------------------

    def ask(self, distributions: dict[str, BaseDistribution]) -> Asked:
        """The sampler proposes on the memory study; the trial is then written to the database
        in one insert, with every parameter (so a crash leaves either no trial or a whole
        one)."""
        with self._asking:
            with self.lock:
                trial = self.memory.ask(distributions)
                if self._pruner_view is not None:
                    self._pruner_view.started(trial.number)
                frozen = self._memory_storage.get_trial(self.memory_trial_id(trial.number))
            # Without the lock: an outage is waited out here while reports go on.
            trial_id = self.write(create_trial_once, self._storage, self._db_study_id, frozen)
            number = trial.number
            # One indexed read says whether the database numbered it the same (else another
            # writer added trials: rebuild).
            if patient(self._storage.get_trial_id_from_study_id_trial_number)(
                    self._db_study_id, number) != trial_id:
                number = patient(self._storage.get_trial)(trial_id).number
                log.warning(
                    "study %s: trial %d in memory is %d in the database (another writer?); "
                    "rebuilding the mirror", self.db.study_name, trial.number, number,
                )
                self.rebuild()
            with self.lock:
                self._db_ids[number] = trial_id
            return Asked(number, trial_id, dict(trial.params))

    def trial(self, number: int, trial_id: int) -> MirroredTrial:
        """The running trial ``number`` (database id ``trial_id``), for its reports."""
        return MirroredTrial(self, number, trial_id)

    def tell(
        self,
        trial: int,
        values: float | Sequence[float] | None = None,
        state: TrialState | None = None,
        skip_if_finished: bool = False,
    ) -> FrozenTrial:
        """``Study.tell`` on the memory study (Optuna validates and turns the arguments into a
        state and values, the sampler's ``after_trial`` runs), then the same state and values
        written to the database trial in one update by its id
        (``BaseStorage.set_trial_state_values``): no reading the trial back twice, as
        ``Study.tell`` on the database study would."""
        with self.lock:
            before = self.memory_frozen(trial)
            if before.state.is_finished() and skip_if_finished:
                return copy.deepcopy(before)
            told = self.memory.tell(trial, values, state=state, skip_if_finished=skip_if_finished)
            if self._pruner_view is not None:
                self._pruner_view.finished(trial)
            db_id = self._db_ids.get(trial)
        if db_id is None:  # a trial this mirror did not create: its id, read once
            db_id = patient(self._storage.get_trial_id_from_study_id_trial_number)(
                self._db_study_id, trial)
            with self.lock:
                self._db_ids[trial] = db_id
        try:
            # Without the lock: an outage is waited out here while reports go on.
            def told_already() -> bool | None:
                """Whether the last try's commit landed (its answer lost)."""
                held = self._storage.get_trial(db_id)
                return True if (held.state, held.values) == (told.state, told.values) else None
            self.write(self._storage.set_trial_state_values, db_id, told.state, told.values,
                       landed=told_already)
        except UpdateFinishedTrialError:
            if not skip_if_finished:
                raise
            # Finished in the database behind our back (another writer): take its copy.
            return self.get_trials(deepcopy=True)[trial]
        return told

    def write(self, method: Callable[..., Any], *args: Any,
              landed: Callable[[], Any] | None = None) -> Any:
        """A write to the database study after the memory one: if it fails, the memory study
        is rebuilt from the database so the two never disagree. An unreachable database is
        waited out by a controller (:mod:`tuner.db.outage`); a request handler's write raises
        :class:`~tuner.db.outage.DatabaseUnavailable` with the memory study ahead, and the
        request, sent again, writes it. A retry may follow a commit that landed with its
        answer lost: ``method`` is idempotent, or ``landed()`` says whether the last try went
        through (its answer, or None) before the retry tries again."""
        tries = 0

        def once() -> Any:
            nonlocal tries
            tries += 1
            if tries > 1 and landed is not None:
                found = landed()
                if found is not None:
                    return found
            return method(*args)
        try:
            return patient(once)()
        except DatabaseUnavailable:
            raise
        except Exception:
            self.rebuild()
            raise

    def get_trials(
        self, deepcopy: bool = True, states: tuple[TrialState, ...] | None = None
    ) -> list[FrozenTrial]:
        """The trials, from memory (equal to the database's)."""
        with self.lock:
            return self.memory.get_trials(deepcopy=deepcopy, states=states)

    @property
    def storage(self) -> BaseStorage:
        """The database's storage."""
        return self._storage

    def db_trial_id(self, number: int) -> int:
        """The database id of trial ``number`` (tunehub's trial row keeps it); remembered for
        the trials this mirror created, asked the database once for the others."""
        trial_id = self._db_ids.get(number)
        if trial_id is None:
            trial_id = self._storage.get_trial_id_from_study_id_trial_number(
                self._db_study_id, number)
            self._db_ids[number] = trial_id
        return trial_id

    def memory_frozen(self, number: int) -> FrozenTrial:
        """Trial ``number`` of the memory study, not copied: read it, never change it."""
        return self._memory_storage.get_trial(self.memory_trial_id(number))

    def memory_trial_id(self, number: int) -> int:
        return self._memory_storage.get_trial_id_from_study_id_trial_number(
            self._memory_study_id, number
        )

    def memory_trial(self, number: int) -> optuna.trial.Trial:
        return trial_for(self.memory, self.memory_trial_id(number))

    def complete_params(
        self, number: int, distributions: dict[str, BaseDistribution]
    ) -> dict[str, object]:
        """The parameters of a trial created without all of them (a controller of an earlier
        version died inside ``ask``): the sampler suggests the missing ones on the memory
        study, and each is written to the database trial too."""
        with self.lock:
            before = dict(self.get_trials(deepcopy=False)[number].params)
            params = complete_params(self.memory, self.memory_trial_id(number), distributions)
            db_id = self.db_trial_id(number)
            for name, value in params.items():
                if name not in before:
                    dist = distributions[name]
                    self._storage.set_trial_param(db_id, name, dist.to_internal_repr(value), dist)
            return params


def bounded(sampler: BaseSampler, seed: int | None) -> BaseSampler:
    """TPE behind its bounded view; other samplers as they are (random and grid read no
    history; CMA-ES keeps its own state; GP is meant for small budgets)."""
    if isinstance(sampler, optuna.samplers.TPESampler):
        return BoundedTPE(sampler, seed)
    return sampler


def bounded_pruner(pruner: BasePruner, seed: int | None) -> BoundedPruner | None:
    """Put the bounded view under tunehub's rules for small sweeps (which count trials at a
    step on the whole study, once per step); the view, to keep informed, or None for no
    pruner."""
    if isinstance(pruner, EnoughTrialsPruner):
        view = BoundedPruner(pruner.inner, seed)
        pruner.inner = view
        return view
    return None


def load_mirror(spec: SweepSpec, study_name: str, url: str) -> StudyMirror:
    """The sweep's mirror, read from the database (an outage waited out by a controller:
    building it only reads)."""
    return patient(StudyMirror)(spec, study_name, url)
