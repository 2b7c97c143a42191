"""The controller's logic on the in-process instant backend (tuner/backends/instant.py): trials
asked ahead, retries, cancel races, the windows a controller can die in, and the ledger's
refusals. Real database (SQLite and PostgreSQL), real Optuna study, real ledger; only the trial
process is replaced, and each test says when every attempt ends, so nothing here waits on a
clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState as OptunaTrialState
from prometheus_client import REGISTRY
from sqlalchemy import select

from tunehub_base.settings import load_settings
from tuner.backends._base import TrialLaunch
from tuner.backends.instant import InstantBackend, Outcome
from tuner.db import Database, Trial, TrialReport
from tuner.errors import Conflict, NotFound
from tuner.lifecycle.ledger import Ledger
from tuner.lifecycle.states import IllegalTransition, SweepState, TrialState
from tuner.scheduling.host import SweepHost
from tuner.scheduling.report_writer import ReportRow, ReportWriter
from tuner.search.mirror import StudyMirror
from tuner.search.study import forget_storages, storage_for
from tuner.spec import SweepSpec
from tuner.sweep_store import Actor, SweepStore

ALICE = Actor("alice", admin=True)
GUARD_SECONDS = 60  # a hung test fails instead of waiting for pytest's timeout


def hold(launch: TrialLaunch, params: dict[str, Any]) -> Outcome:
    return Outcome(hold=True)


@dataclass
class Lab:
    """A tunehub home with a database, an instant backend and engines on it."""

    tmp: Path
    db_url: str
    backend: InstantBackend = field(default_factory=lambda: InstantBackend(script=hold))
    engines: list[SweepHost] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.settings = load_settings({
            "TUNEHUB_HOME": str(self.tmp / "home"), "TUNEHUB_DB_URL": self.db_url,
        }).ensure_dirs()
        self.db = Database(self.db_url)
        self.store = SweepStore(self.db, self.settings)
        self.ledger = Ledger(self.db)

    def submit(self, **fields: Any) -> int:
        spec = SweepSpec.from_dict({
            "name": "unit", "command": "python -c pass", "metric": "score",
            "trials": 3, "parallelism": 2, "max_retries": 0, "sampler": "random", "seed": 1,
            "space": {"x": {"type": "float", "low": 0.0, "high": 1.0},
                      "y": {"type": "float", "low": 0.0, "high": 1.0}},
            **fields,
        })
        return self.store.submit(spec, ALICE, self.backend).id

    async def engine(self, stable_api_url: bool = False) -> SweepHost:
        engine = SweepHost(self.db, self.settings, {self.backend.name: self.backend},
                        "http://127.0.0.1:9/", stable_api_url=stable_api_url)
        self.backend.bind(engine.report)
        await engine.start()
        self.engines.append(engine)
        return engine

    async def until(self, predicate: Callable[[], bool]) -> None:
        async with asyncio.timeout(GUARD_SECONDS):
            await self.backend.until(predicate)

    def trials(self, sweep_id: int) -> dict[int, Trial]:
        return {t.number: t for t in self.ledger.trials(sweep_id)}

    def optuna(self, sweep_id: int) -> dict[int, optuna.trial.FrozenTrial]:
        study = optuna.load_study(study_name=self.ledger.sweep(sweep_id).study_name,
                                  storage=storage_for(self.db_url))
        return {t.number: t for t in study.trials}

    async def stop_engine_with_held(self, sweep_id: int, held: int,
                                    stable_api_url: bool = False) -> None:
        """An engine runs the sweep until ``held`` of its attempts run, then stops (its
        controller releases the sweep; what becomes of the attempts is the test's to say)."""
        engine = await self.engine(stable_api_url=stable_api_url)
        engine.run_sweep(sweep_id)
        await self.until(lambda: len(self.held(sweep_id)) == held)
        await engine.close()

    def held(self, sweep_id: int) -> list[tuple[int, int]]:
        return sorted(k for k, launch in self.backend.held.items() if launch.sweep_id == sweep_id)


@pytest.fixture
async def lab(tmp_path: Path, db_url: str) -> AsyncIterator[Lab]:
    lab = Lab(tmp_path, db_url)
    yield lab
    for engine in lab.engines:
        await engine.close()
    lab.db.dispose()
    storage_for(db_url).engine.dispose()
    forget_storages()


def assert_in_step_with_optuna(lab: Lab, sweep_id: int) -> None:
    """Every finished trial of ours is finished in Optuna the same way (cancelled is FAIL)."""
    theirs = lab.optuna(sweep_id)
    expected = {TrialState.COMPLETED: OptunaTrialState.COMPLETE,
                TrialState.PRUNED: OptunaTrialState.PRUNED}
    for number, row in lab.trials(sweep_id).items():
        assert row.state.is_finished(), (number, row.state)
        assert theirs[number].state == expected.get(row.state, OptunaTrialState.FAIL), number
        if row.state == TrialState.COMPLETED:
            assert theirs[number].value == row.value


async def test_a_trial_is_asked_ahead_and_takes_the_first_free_slot(lab: Lab) -> None:
    sweep_id = lab.submit(trials=3, parallelism=1)
    engine = await lab.engine()
    task = engine.run_sweep(sweep_id)
    await lab.until(lambda: len(lab.held(sweep_id)) == 1)
    await engine.controllers[sweep_id].asked_ahead()  # (the sampler runs in a worker thread)
    # One trial runs; the next was asked while it runs: a pending row, never launched.
    rows = lab.trials(sweep_id)
    assert {n: (r.state, r.attempts) for n, r in rows.items()} == {
        0: (TrialState.RUNNING, 1), 1: (TrialState.PENDING, 0)}
    await lab.backend.finish(lab.held(sweep_id)[0], Outcome(value=0.5))
    await lab.until(lambda: len(lab.backend.launches) == 2)
    assert lab.backend.launches[1].trial_id == rows[1].id  # the one asked ahead
    for _ in range(2):
        await lab.until(lambda: len(lab.held(sweep_id)) == 1)
        await lab.backend.finish(lab.held(sweep_id)[0], Outcome(value=0.7))
    assert await task == SweepState.COMPLETED
    sweep = lab.ledger.sweep(sweep_id)
    assert (sweep.n_started, sweep.n_completed, sweep.best_value) == (3, 3, 0.7)
    assert_in_step_with_optuna(lab, sweep_id)


async def test_a_failed_attempt_is_retried_then_the_trial_fails_and_stops_the_sweep(
    lab: Lab,
) -> None:
    lab.backend.script = lambda launch, params: Outcome(fail=f"boom {launch.attempt}")
    sweep_id = lab.submit(trials=4, parallelism=1, max_retries=1, max_failed_trials=1)
    engine = await lab.engine()
    assert await asyncio.wait_for(engine.run_sweep(sweep_id), GUARD_SECONDS) == SweepState.FAILED
    rows = lab.trials(sweep_id)
    assert (rows[0].state, rows[0].attempts, rows[0].reason) == (TrialState.FAILED, 2, "boom 2")
    log = Path(rows[0].log_path or "").read_text()
    assert "trial 0, attempt 1 ===" in log and "attempt 2 (after: boom 1) ===" in log
    # The rest (the trial asked ahead started in the freed slot, then awaited its retry):
    # cancelled with the stopped sweep, not counted as failed.
    assert [(r.state, r.reason) for n, r in rows.items() if n] == [
        (TrialState.CANCELLED, "sweep stopped")] * (len(rows) - 1)
    sweep = lab.ledger.sweep(sweep_id)
    assert sweep.n_failed == 1 and sweep.reason is not None
    assert sweep.reason.startswith("stopped after 1 failed trials (max_failed_trials: 1)")
    assert_in_step_with_optuna(lab, sweep_id)


async def test_cancel_stops_running_and_asked_ahead_trials(lab: Lab) -> None:
    sweep_id = lab.submit(trials=5, parallelism=2)
    engine = await lab.engine()
    task = engine.run_sweep(sweep_id)
    await lab.until(lambda: len(lab.held(sweep_id)) == 2)
    running = lab.held(sweep_id)
    # The API's way: the stored request, and the controller of this process woken.
    view = lab.store.cancel(sweep_id, ALICE, here=engine)
    assert view.state == SweepState.CANCELLING
    assert await asyncio.wait_for(task, GUARD_SECONDS) == SweepState.CANCELLED
    assert sorted(lab.backend.cancels) == running
    rows = lab.trials(sweep_id)
    assert {r.state for r in rows.values()} == {TrialState.CANCELLED}
    assert sorted(r.attempts for r in rows.values()) == [0, 1, 1]  # two ran, one asked ahead
    assert lab.ledger.sweep(sweep_id).reason == "cancelled"
    assert_in_step_with_optuna(lab, sweep_id)
    # Cancelled again (its answer lost, say): answered as it is, nothing changes.
    def seen(trials: dict[int, Trial]) -> dict[int, tuple[object, ...]]:
        return {n: (t.state, t.reason, t.attempts, t.finished_at) for n, t in trials.items()}

    assert lab.store.cancel(sweep_id, ALICE).state == SweepState.CANCELLED
    assert seen(lab.trials(sweep_id)) == seen(rows)


async def test_a_result_that_arrives_with_the_cancel_is_kept(lab: Lab) -> None:
    sweep_id = lab.submit(trials=4, parallelism=2)
    engine = await lab.engine()
    task = engine.run_sweep(sweep_id)
    await lab.until(lambda: len(lab.held(sweep_id)) == 2)
    first, second = lab.held(sweep_id)
    # The trial's success is queued before the cancel's wake-up: it is a result.
    await lab.backend.finish(first, Outcome(value=0.9))
    engine.cancel(sweep_id)
    assert await asyncio.wait_for(task, GUARD_SECONDS) == SweepState.CANCELLED
    by_id = {r.id: r for r in lab.trials(sweep_id).values()}
    assert (by_id[first[0]].state, by_id[first[0]].value) == (TrialState.COMPLETED, 0.9)
    assert by_id[second[0]].state == TrialState.CANCELLED
    assert lab.ledger.sweep(sweep_id).n_completed == 1
    assert_in_step_with_optuna(lab, sweep_id)


async def test_a_sweep_no_controller_runs_is_cancelled_here(lab: Lab) -> None:
    sweep_id = lab.submit(trials=4, parallelism=2)
    await lab.stop_engine_with_held(sweep_id, 2)  # the controller stops; its trials vanish
    lab.backend.lose_all()

    def finished() -> float:
        return REGISTRY.get_sample_value("tunehub_sweeps_finished_total",
                                         {"state": "cancelled"}) or 0.0

    before = finished()
    view = lab.store.cancel(sweep_id, ALICE)  # the CLI's way, from another process
    assert view.state == SweepState.CANCELLED
    rows = lab.trials(sweep_id)
    assert {r.state for r in rows.values()} == {TrialState.CANCELLED}
    assert {r.reason for r in rows.values()} == {"sweep cancelled"}
    assert_in_step_with_optuna(lab, sweep_id)
    # Ended again (a cancel here racing the controller's own end): counted once.
    lab.store._cancel_here(sweep_id)
    assert finished() == before + 1


async def test_attempts_that_outlive_their_controller_are_adopted_with_a_stable_address(
    lab: Lab,
) -> None:
    sweep_id = lab.submit(trials=2, parallelism=2)
    # The service restarts; its trials (Jobs) keep running.
    await lab.stop_engine_with_held(sweep_id, 2, stable_api_url=True)
    second = await lab.engine(stable_api_url=True)
    task = second.run_sweep(sweep_id)
    await lab.until(lambda: len(lab.backend.reconciled) == 1)
    assert lab.backend.reconciled == [set(lab.held(sweep_id))]
    for key in lab.held(sweep_id):  # they report to the new controller, with their tokens
        await lab.backend.finish(key, Outcome(steps=(0.1,), value=0.3))
    assert await asyncio.wait_for(task, GUARD_SECONDS) == SweepState.COMPLETED
    rows = lab.trials(sweep_id)
    assert [(r.state, r.attempts, r.reason) for r in rows.values()] == [
        (TrialState.COMPLETED, 1, None)] * 2
    assert len(lab.backend.launches) == 2  # adopted, not rerun
    assert_in_step_with_optuna(lab, sweep_id)


async def test_attempts_that_died_with_their_controller_are_rerun(lab: Lab) -> None:
    sweep_id = lab.submit(trials=2, parallelism=2)
    await lab.stop_engine_with_held(sweep_id, 2)
    lab.backend.lose_all()  # local trials die with their controller
    lab.backend.script = lambda launch, params: Outcome(value=0.5)
    second = await lab.engine()
    assert await asyncio.wait_for(second.run_sweep(sweep_id), GUARD_SECONDS) == (
        SweepState.COMPLETED)
    rows = lab.trials(sweep_id)
    # Rerun once more though max_retries is 0: they did not fail by themselves.
    assert [(r.state, r.attempts) for r in rows.values()] == [(TrialState.COMPLETED, 2)] * 2
    log = Path(rows[0].log_path or "").read_text()
    assert "attempt 2 (after: controller restarted)" in log
    assert_in_step_with_optuna(lab, sweep_id)


class Killed(BaseException):
    """The controller's process dies here (no handler of the controller's runs)."""


async def test_death_between_our_commit_and_optunas_tell_is_repaired_on_resume(
    lab: Lab, monkeypatch: pytest.MonkeyPatch,
) -> None:
    lab.backend.script = lambda launch, params: (
        Outcome(value=0.25) if launch.number == 0 else Outcome(hold=True))
    sweep_id = lab.submit(trials=2, parallelism=1)
    original = StudyMirror.tell

    def die_on_first_tell(self: StudyMirror, *args: Any, **kwargs: Any) -> Any:
        raise Killed

    monkeypatch.setattr(StudyMirror, "tell", die_on_first_tell)
    first = await lab.engine()
    with pytest.raises(Killed):
        await asyncio.wait_for(first.run_sweep(sweep_id), GUARD_SECONDS)
    monkeypatch.setattr(StudyMirror, "tell", original)
    # Our row is committed; Optuna still thinks the trial runs.
    assert lab.trials(sweep_id)[0].state == TrialState.COMPLETED
    assert lab.optuna(sweep_id)[0].state == OptunaTrialState.RUNNING
    await first.close()
    lab.backend.lose_all()
    lab.backend.script = lambda launch, params: Outcome(value=0.5)
    second = await lab.engine()
    assert await asyncio.wait_for(second.run_sweep(sweep_id), GUARD_SECONDS) == (
        SweepState.COMPLETED)
    rows = lab.trials(sweep_id)
    assert sorted(rows) == [0, 1] and rows[0].attempts == 1  # nothing finished is redone
    assert lab.ledger.sweep(sweep_id).n_completed == 2
    assert_in_step_with_optuna(lab, sweep_id)


async def test_death_inside_ask_leaves_a_trial_the_resume_runs(lab: Lab) -> None:
    lab.backend.script = lambda launch, params: Outcome(value=params["x"])
    sweep_id = lab.submit(trials=2, parallelism=1)
    study = optuna.load_study(study_name=lab.ledger.sweep(sweep_id).study_name,
                              storage=storage_for(lab.db_url))
    orphan = study.ask()  # created in Optuna, no parameters, no row of ours
    engine = await lab.engine()
    assert await asyncio.wait_for(engine.run_sweep(sweep_id), GUARD_SECONDS) == (
        SweepState.COMPLETED)
    rows = lab.trials(sweep_id)
    assert sorted(rows) == [0, 1]
    assert set(rows[orphan.number].params) == {"x", "y"}
    assert_in_step_with_optuna(lab, sweep_id)


async def test_the_ledger_refuses_an_illegal_change_before_writing(lab: Lab) -> None:
    lab.backend.script = lambda launch, params: Outcome(value=0.5)
    sweep_id = lab.submit(trials=1, parallelism=1)
    engine = await lab.engine()
    assert await asyncio.wait_for(engine.run_sweep(sweep_id), GUARD_SECONDS) == (
        SweepState.COMPLETED)
    row = lab.trials(sweep_id)[0]
    with pytest.raises(IllegalTransition, match="completed -> running"):
        lab.ledger.start_attempt(sweep_id, row.id, "0" * 64)
    with pytest.raises(IllegalTransition, match="completed -> failed"):
        lab.ledger.finish_trial(sweep_id, row.id, TrialState.FAILED, None, "late", False,
                                "maximize", _NoTeller())
    after = lab.trials(sweep_id)[0]
    assert (after.state, after.attempts, after.value) == (TrialState.COMPLETED, 1, 0.5)
    with pytest.raises(Conflict, match="is completed; nothing to resume"):
        engine.run_sweep(sweep_id)


async def test_a_report_at_a_step_already_reported_replaces_it(lab: Lab) -> None:
    lab.backend.script = lambda launch, params: Outcome(steps=(0.1, 0.2), value=0.3)
    sweep_id = lab.submit(trials=1, parallelism=1)
    engine = await lab.engine()
    assert await asyncio.wait_for(engine.run_sweep(sweep_id), GUARD_SECONDS) == (
        SweepState.COMPLETED)
    row = lab.trials(sweep_id)[0]

    def reports() -> dict[int, float]:
        with lab.db.session() as s:
            return dict(s.execute(select(TrialReport.step, TrialReport.value)
                                  .where(TrialReport.trial_id == row.id)).tuples().all())

    assert reports() == {1: 0.1, 2: 0.2}
    writer = ReportWriter(lab.db)
    writer.write(ReportRow(row.id, 1, 0.15))
    assert reports() == {1: 0.15, 2: 0.2}
    after = lab.trials(sweep_id)[0]
    assert (after.value, after.last_step) == (0.15, 1)
    with pytest.raises(NotFound):
        writer.write(ReportRow(row.id + 1000, 1, 0.5))
    writer.close()
    assert reports() == {1: 0.15, 2: 0.2}


async def test_a_rerun_attempt_repeats_its_steps_without_a_warning(
    lab: Lab, recwarn: pytest.WarningsRecorder,
) -> None:
    lab.backend.script = lambda launch, params: (
        Outcome(steps=(0.1,), fail="boom") if launch.attempt == 1
        else Outcome(steps=(0.4, 0.45), value=0.5))
    sweep_id = lab.submit(trials=1, parallelism=1, max_retries=1)
    engine = await lab.engine()
    assert await asyncio.wait_for(engine.run_sweep(sweep_id), GUARD_SECONDS) == (
        SweepState.COMPLETED)
    row = lab.trials(sweep_id)[0]
    assert (row.state, row.attempts, row.value) == (TrialState.COMPLETED, 2, 0.5)
    # Optuna keeps a step's first value; the second attempt's new step is recorded.
    assert lab.optuna(sweep_id)[0].intermediate_values == {1: 0.1, 2: 0.45}
    assert not [w for w in recwarn if "already reported" in str(w.message)]


class _NoTeller:
    def tell(self, trial: int, values: float | None = None,
             state: OptunaTrialState | None = None, skip_if_finished: bool = False) -> None:
        raise AssertionError("Optuna must not be told of a refused change")
