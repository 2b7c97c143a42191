"""Where tunehub leans on Optuna beyond its user-facing API: one module, pinned by a canary.

Everywhere else tunehub drives Optuna the way its documentation shows a user
(``create_study``/``load_study``, ``Study.ask``/``tell``/``add_trials``, the samplers, a
``BasePruner`` subclass). Three things are not that, and live here:

- :class:`GridSampler` overrides ``GridSampler.after_trial``, whose body is an implementation
  detail: today it only calls ``study.stop()`` once the grid is used up.
- :func:`trial_for` calls the ``optuna.trial.Trial(study, trial_id)`` constructor, which
  Optuna's documentation says not to call directly (``optimize`` and ``ask`` make trials).
- :func:`record_intermediate_values` writes rows of Optuna's ``trial_intermediate_values``
  table (``optuna.storages._rdb.models``) in a transaction of tunehub's: a group commit of many
  trials' reports (:mod:`tuner.scheduling.report_writer`).
- :func:`create_trial_once` adds an asked trial in a transaction of tunehub's through
  ``RDBStorage._get_prepared_new_trial`` (the body of ``create_new_trial``), so that adding it
  is idempotent: ``create_new_trial`` retries by itself after a failed commit, and a commit
  that landed with its answer lost then leaves the trial in the study twice.

One more seam is Optuna's storage interface (``BaseStorage``: ``get_study_id_from_name``,
``get_all_trials``, ``get_trial``, ``create_new_trial(template_trial=...)``,
``get_trial_id_from_study_id_trial_number``, ``set_trial_param``), public methods that Optuna
describes as internal; :mod:`tuner.search.mirror` calls them to copy trials between its memory and
database studies.

``tests/test_optuna_adapter.py`` asserts the exact behaviour each of these relies on, and that
the installed Optuna lies in the range ``pyproject.toml`` declares (the range those tests
passed on). An Optuna upgrade that changes any of it fails there, by name, not in a sweep.
"""

from __future__ import annotations

from collections.abc import Sequence

import optuna
from optuna.storages import RDBStorage
from optuna.storages._rdb import models as rdb_models
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session


class GridSampler(optuna.samplers.GridSampler):
    """Optuna's grid sampler without its ``study.stop()`` when the grid is used up (``stop``
    is only legal inside ``study.optimize``, and the controller asks and tells instead); the
    controller stops at ``trials``, which submission caps at the grid size."""

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        return None


def trial_for(study: optuna.Study, trial_id: int) -> optuna.trial.Trial:
    """A handle on the existing trial ``trial_id`` of ``study``, to report to, ask the pruner
    about, or suggest the parameters it is missing (a controller died inside ``ask``).

    Optuna's constructor reads the trial from the storage and calls the study's
    ``sampler.before_trial`` (a no-op for the samplers tunehub uses): cheap enough per trial,
    and made only on a trial's first report."""
    return optuna.trial.Trial(study, trial_id)


def record_intermediate_values(session: Session, rows: Sequence[tuple[int, int, float]]) -> None:
    """Optuna's intermediate values ``(optuna trial id, step, value)`` inserted in the caller's
    transaction, as ``RDBStorage.set_trial_intermediate_value`` would store each (its table,
    its stored form of a value), so that a group commit of many trials' reports writes Optuna's
    rows beside tunehub's at once instead of in a transaction per report. A step the trial has
    already is left as it is: Optuna keeps a step's first value."""
    model = rdb_models.TrialIntermediateValueModel
    table = model.__table__
    insert = (postgresql_insert(table) if session.get_bind().dialect.name == "postgresql"
              else sqlite_insert(table))
    values = []
    for trial_id, step, value in rows:
        stored, kind = model.intermediate_value_to_stored_repr(value)
        values.append({"trial_id": trial_id, "step": step, "intermediate_value": stored,
                       "intermediate_value_type": kind})
    session.execute(insert.on_conflict_do_nothing(index_elements=["trial_id", "step"]), values)


def create_trial_once(storage: RDBStorage, study_id: int, template: FrozenTrial) -> int:
    """The id of the study's trial numbered ``template.number``, added from ``template`` (an
    asked trial: its parameters, its state) unless it is there already with the same
    parameters: the trial a last try added, whose commit's answer was lost. One transaction,
    the study's row locked as Optuna locks it to number a trial."""
    with Session(storage.engine) as session, session.begin():
        rdb_models.StudyModel.find_or_raise_by_id(study_id, session, for_update=True)
        there = session.query(rdb_models.TrialModel).filter(
            rdb_models.TrialModel.study_id == study_id,
            rdb_models.TrialModel.number == template.number).one_or_none()
        if there is not None:
            held = {p.param_name: p.param_value for p in there.params}
            if held == {name: template.distributions[name].to_internal_repr(value)
                        for name, value in template.params.items()}:
                return int(there.trial_id)
        trial = storage._get_prepared_new_trial(study_id, template, session)
        session.flush()
        return int(trial.trial_id)
