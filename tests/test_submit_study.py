"""Submission and its Optuna study: the sweep's id is written on the study after our row
commits, so a failure there must not fail a submission whose sweep already exists."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import optuna
import pytest
from sqlalchemy import create_engine, text

from tunehub_base.settings import load_settings
from tuner.backends.instant import InstantBackend
from tuner.db import Database
from tuner.lifecycle.states import SweepState
from tuner.search.study import SWEEP_ID_ATTR, forget_storages, storage_for
from tuner.spec import SweepSpec
from tuner.sweep_store import Actor, SweepStore

ALICE = Actor("alice", admin=True)

#: A PostgreSQL trigger refusing exactly the write of the sweep id on a study, as a database
#: that fails at that moment would (busy, connection lost): the owner and name written before
#: pass. (Not SQLite: a trigger there can only raise a constraint error, which Optuna's
#: attribute writes ignore without a word.)
REFUSE_SWEEP_ID = [
    """CREATE FUNCTION refuse_sweep_id() RETURNS trigger LANGUAGE plpgsql AS
    $$ BEGIN RAISE EXCEPTION 'refused'; END $$""",
    f"""CREATE TRIGGER refuse_sweep_id BEFORE INSERT ON study_user_attributes
    FOR EACH ROW WHEN (NEW.key = '{SWEEP_ID_ATTR}') EXECUTE FUNCTION refuse_sweep_id()""",
]


@contextmanager
def _store(tmp_path: Path, url: str) -> Iterator[SweepStore]:
    settings = load_settings({
        "TUNEHUB_HOME": str(tmp_path / "home"), "TUNEHUB_DB_URL": url,
    }).ensure_dirs()
    db = Database(url)
    try:
        yield SweepStore(db, settings)
    finally:
        db.dispose()
        storage_for(url).engine.dispose()
        forget_storages()


@pytest.fixture
def store(tmp_path: Path, db_url: str) -> Iterator[SweepStore]:
    with _store(tmp_path, db_url) as store:
        yield store


def _spec() -> SweepSpec:
    return SweepSpec.from_dict({
        "name": "labelled", "command": "python -c pass", "metric": "score", "trials": 2,
        "sampler": "random", "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
    })


def _study(store: SweepStore, sweep_id: int) -> optuna.Study:
    return optuna.load_study(study_name=store.get(sweep_id, ALICE).study_name,
                             storage=storage_for(store.db.url))


def test_the_study_is_labelled_with_the_sweep(store: SweepStore) -> None:
    sweep = store.submit(_spec(), ALICE, InstantBackend())
    assert _study(store, sweep.id).user_attrs == {
        "owner": "alice", "sweep_id": sweep.id, "sweep_name": "labelled"}


def test_a_failed_label_leaves_the_submitted_sweep_and_says_so(
    tmp_path: Path, pg_schema_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    with _store(tmp_path, pg_schema_url) as store:
        storage_for(pg_schema_url)  # Optuna's tables exist once its storage has been opened
        engine = create_engine(pg_schema_url)
        with engine.begin() as conn:
            for statement in REFUSE_SWEEP_ID:
                conn.execute(text(statement))
        engine.dispose()

        with caplog.at_level(logging.WARNING, logger="tunehub.study"):
            sweep = store.submit(_spec(), ALICE, InstantBackend())

        row = store.get(sweep.id, ALICE)
        assert row.state == SweepState.QUEUED and Path(row.code_dir or "").parent.is_dir()
        assert _study(store, sweep.id).user_attrs == {"owner": "alice", "sweep_name": "labelled"}
        assert f"sweep {sweep.id}: could not record its id" in caplog.text
        assert "refused" in caplog.text


def test_the_first_storage_is_made_once_by_threads_at_once(pg_schema_url: str) -> None:
    """The first sweeps submitted at once to a new database: one of them makes Optuna's
    schema, the others wait and share its storage (before, each made it and they raced on
    Optuna's tables and types: a 500 for a submission)."""
    forget_storages()
    start = threading.Barrier(6)
    made: list[object] = []
    errors: list[BaseException] = []

    def first_call() -> None:
        start.wait()
        try:
            made.append(storage_for(pg_schema_url))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=first_call) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == [] and len(made) == 6 and len({id(s) for s in made}) == 1
    forget_storages()
