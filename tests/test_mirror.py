"""The controller's in-memory study (tuner.search.mirror) against the database's, on SQLite and
PostgreSQL: equal after asks, reports and tells, equal after a rebuild (a resume), the sampler
sees every trial with its values, and an ask reads nothing whose size grows with the study."""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import event

from tuner.search.mirror import MirroredTrial, StudyMirror
from tuner.search.study import create_study, forget_storages, storage_for
from tuner.spec import SweepSpec


def _spec(**extra: Any) -> SweepSpec:
    return SweepSpec.from_dict({
        "name": "mirror", "command": "python -c pass", "metric": "score", "trials": 100,
        "parallelism": 2, "sampler": "tpe", "seed": 3,
        "space": {
            "x": {"type": "float", "low": 0.0, "high": 1.0},
            "n": {"type": "int", "low": 1, "high": 8},
            "act": {"type": "categorical", "choices": ["relu", "tanh"]},
        },
        **extra,
    })


@pytest.fixture
def study(db_url: str) -> tuple[SweepSpec, str, str]:
    spec = _spec(pruner={"type": "median", "min_trials": 1, "n_startup_trials": 2})
    name = f"mirror-{uuid.uuid4().hex}"
    create_study(spec, name, db_url)
    yield spec, name, db_url
    storage_for(db_url).engine.dispose()
    forget_storages()


def _view(trials: list[FrozenTrial]) -> list[tuple[Any, ...]]:
    """What a sampler or pruner reads of each trial."""
    return [
        (t.number, t.state, t.values, t.params, t.distributions, t.intermediate_values,
         t.user_attrs, t.system_attrs)
        for t in trials
    ]


def _db_trials(name: str, url: str) -> list[FrozenTrial]:
    return optuna.load_study(study_name=name, storage=url).get_trials(deepcopy=False)


def _report(trial: MirroredTrial, value: float, step: int) -> None:
    """A report as the controller makes one: the memory study at once, then the database
    study's row (written here through Optuna's storage; in the service, in a group commit)."""
    if trial.report(value, step):
        trial.mirror.storage.set_trial_intermediate_value(trial.trial_id, step, value)
        trial.written(step)


def _play(mirror: StudyMirror, spec: SweepSpec) -> dict[int, int]:
    """Completed, pruned, failed and still running trials, some with intermediate values."""
    ids = {}
    for i in range(8):
        asked = mirror.ask(spec.distributions())
        ids[asked.number] = asked.trial_id
        trial = mirror.trial(asked.number, asked.trial_id)
        for step in range(1, 1 + i % 3):
            _report(trial, 0.1 * i + step, step)
        if i % 4 == 0:
            mirror.tell(asked.number, 0.5 + i)
        elif i % 4 == 1:
            mirror.tell(asked.number, state=TrialState.PRUNED)
        elif i % 4 == 2:
            mirror.tell(asked.number, state=TrialState.FAIL)
    return ids  # i % 4 == 3: still running


def test_mirror_equals_database_after_asks_reports_tells(study: tuple[SweepSpec, str, str]) -> None:
    spec, name, url = study
    mirror = StudyMirror(spec, name, url)
    ids = _play(mirror, spec)
    db = _db_trials(name, url)
    assert _view(mirror.get_trials(deepcopy=False)) == _view(db)
    assert {t.state for t in db} == {TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL,
                                     TrialState.RUNNING}
    assert any(t.intermediate_values for t in db if t.state == TrialState.RUNNING)
    # The ids handed out are the database's own for those numbers.
    assert all(mirror.db_trial_id(n) == trial_id for n, trial_id in ids.items())
    assert all(set(t.params) == {"x", "n", "act"} for t in db)


def test_rebuild_on_resume_equals_database_and_keeps_numbering(
    study: tuple[SweepSpec, str, str],
) -> None:
    spec, name, url = study
    _play(StudyMirror(spec, name, url), spec)
    resumed = StudyMirror(spec, name, url)  # a new controller: built from the database
    assert _view(resumed.get_trials(deepcopy=False)) == _view(_db_trials(name, url))
    asked = resumed.ask(spec.distributions())
    assert asked.number == 8
    resumed.tell(7, 1.0)  # a trial the previous controller left running
    _report(resumed.trial(asked.number, asked.trial_id), 0.3, 1)
    assert _view(resumed.get_trials(deepcopy=False)) == _view(_db_trials(name, url))


def test_another_writer_is_caught_by_a_rebuild(study: tuple[SweepSpec, str, str]) -> None:
    """Numbers must agree: a trial created behind the mirror's back is picked up, and the
    next trial gets the database's number."""
    spec, name, url = study
    mirror = StudyMirror(spec, name, url)
    mirror.ask(spec.distributions())
    optuna.load_study(study_name=name, storage=url).ask()
    asked = mirror.ask(spec.distributions())
    assert asked.number == 2 and mirror.db_trial_id(2) == asked.trial_id
    assert _view(mirror.get_trials(deepcopy=False)) == _view(_db_trials(name, url))


class _Recording(optuna.samplers.RandomSampler):
    """Notes what the study it samples for holds."""

    def __init__(self) -> None:
        super().__init__(seed=0)
        self.seen: list[list[tuple[Any, ...]]] = []

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.seen.append(_view(study.get_trials(deepcopy=False)))


def test_sampler_sees_every_trial_with_its_values(study: tuple[SweepSpec, str, str]) -> None:
    spec, name, url = study
    _play(StudyMirror(spec, name, url), spec)
    sampler = _Recording()
    mirror = StudyMirror(spec, name, url, sampler=sampler)
    mirror.ask(spec.distributions())
    db = _view(_db_trials(name, url))
    # Sampling the new trial (number 8), the sampler saw the database's 8 earlier trials as
    # they are: completed, pruned and failed with their values, running with their
    # intermediate values.
    assert sampler.seen and sampler.seen[0][:8] == db[:8]
    assert sampler.seen[0][8][:2] == (8, TrialState.RUNNING)


def test_pruner_decides_on_the_reports(study: tuple[SweepSpec, str, str]) -> None:
    spec, name, url = study
    mirror = StudyMirror(spec, name, url)
    for value in (0.9, 0.8):
        asked = mirror.ask(spec.distributions())
        _report(mirror.trial(asked.number, asked.trial_id), value, 1)
        mirror.tell(asked.number, value)
    weak = mirror.ask(spec.distributions())
    trial = mirror.trial(weak.number, weak.trial_id)
    _report(trial, 0.1, 1)
    assert trial.should_prune()  # maximize: 0.1 is below the median of 0.9 and 0.8
    strong = mirror.ask(spec.distributions())
    trial = mirror.trial(strong.number, strong.trial_id)
    _report(trial, 0.95, 1)
    assert not trial.should_prune()


def test_orphan_parameters_are_completed_in_both(study: tuple[SweepSpec, str, str]) -> None:
    """A trial an earlier controller created without parameters (killed inside ask)."""
    spec, name, url = study
    optuna.load_study(study_name=name, storage=url).ask()
    mirror = StudyMirror(spec, name, url)
    params = mirror.complete_params(0, spec.distributions())
    assert set(params) == {"x", "n", "act"}
    assert _db_trials(name, url)[0].params == params
    assert _view(mirror.get_trials(deepcopy=False)) == _view(_db_trials(name, url))


def _statements_per_ask(mirror: StudyMirror, spec: SweepSpec, url: str) -> list[str]:
    statements: list[str] = []

    def note(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    engine = storage_for(url).engine
    event.listen(engine, "before_cursor_execute", note)
    try:
        asked = mirror.ask(spec.distributions())
        trial = mirror.trial(asked.number, asked.trial_id)
        _report(trial, 0.5, 1)
        trial.should_prune()
        mirror.tell(asked.number, 0.5)
    finally:
        event.remove(engine, "before_cursor_execute", note)
    return statements


def test_a_trial_reads_the_same_whatever_the_history(study: tuple[SweepSpec, str, str]) -> None:
    """The cost that grew with the sweep was reading the whole study per ask: the database
    statements of one trial's ask, report, should_prune and tell are the same after 12 trials
    (TPE past its 10 random startup trials) and after 50, and none reads the study's
    trials."""
    spec, name, url = study
    mirror = StudyMirror(spec, name, url)
    for _ in range(12):
        _statements_per_ask(mirror, spec, url)
    early = _statements_per_ask(mirror, spec, url)
    for _ in range(36):
        _statements_per_ask(mirror, spec, url)
    late = _statements_per_ask(mirror, spec, url)
    assert late == early
    whole_study = [s for s in late if "FROM trials" in s and "trials.study_id = " in s
                   and "trials.number = " not in s and "trials.trial_id < " not in s]
    assert whole_study == []
    assert len(mirror.get_trials(deepcopy=False)) == 50 == len(_db_trials(name, url))


def test_a_controller_loads_its_study_off_the_event_loop(
    db_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """A resumed sweep's study is read whole when its controller starts (about a second at
    10,000 trials): that happens in a worker thread, not on the event loop the engine's other
    sweeps and the report API share."""
    from benchmarks._tunehub import run_sweep, settings_for
    from benchmarks.scale import scale_spec
    from tuner.backends.instant import InstantBackend
    from tuner.db import Database

    caplog.set_level(logging.DEBUG, logger="tunehub.mirror")
    db = Database(db_url)
    try:
        run = asyncio.run(run_sweep(settings_for(tmp_path / "home", db_url), db,
                                    SweepSpec.from_dict(scale_spec(4)), InstantBackend()))
    finally:
        db.dispose()
        storage_for(db_url).engine.dispose()
        forget_storages()
    assert run.state == "completed"
    loads = [r for r in caplog.records if "mirrored" in r.getMessage()]
    assert loads and all(r.thread != threading.get_ident() for r in loads)


def test_reports_and_tells_write_without_reading_the_trial_back(
    study: tuple[SweepSpec, str, str],
) -> None:
    """A report is one insert of the intermediate value and a tell one update of the trial's
    state with its value: neither reads the trial's parameters and attributes back from the
    database (``Study.tell``/``Trial.report`` on the database study read the whole trial one to
    three times per call)."""
    spec, name, url = study
    mirror = StudyMirror(spec, name, url)
    asked = mirror.ask(spec.distributions())
    trial = mirror.trial(asked.number, asked.trial_id)
    statements: list[str] = []

    def note(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(" ".join(statement.split()))

    engine = storage_for(url).engine
    event.listen(engine, "before_cursor_execute", note)
    try:
        _report(trial, 0.5, 1)
        _report(trial, 0.7, 1)  # a step already reported: Optuna keeps the first, no write
        _report(trial, 0.6, 2)
        mirror.tell(asked.number, 0.6)
    finally:
        event.remove(engine, "before_cursor_execute", note)
    writes = [s.split(" SET ")[0].split(" (")[0] for s in statements
              if not s.startswith("SELECT")]
    assert writes == ["INSERT INTO trial_intermediate_values"] * 2 + [
        "UPDATE trials", "INSERT INTO trial_values"]
    whole_trial = [s for s in statements if s.startswith("SELECT") and any(
        f"FROM {table}" in s for table in ("trial_params", "trial_system_attributes",
                                           "trial_user_attributes"))]
    assert whole_trial == []
    assert len(statements) <= 10
    assert _view(mirror.get_trials(deepcopy=False)) == _view(_db_trials(name, url))
