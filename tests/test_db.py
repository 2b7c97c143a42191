"""The schema: Alembic migrations match the models, on SQLite and PostgreSQL, beside Optuna's
own tables in the same database."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from tuner.db import Base, Database
from tuner.db.engine import VERSION_TABLE, ours
from tuner.search.study import storage_for


def test_migrations_match_models_and_coexist_with_optuna(db_url: str) -> None:
    db = Database(db_url)
    Database(db_url)  # a second open migrates nothing and breaks nothing
    storage_for(db_url)  # Optuna creates its tables in the same database
    with db.engine.connect() as conn:
        opts = {"version_table": VERSION_TABLE, "include_name": ours}
        ctx = MigrationContext.configure(conn, opts=opts)
        assert compare_metadata(ctx, Base.metadata) == []
        assert ctx.get_current_revision() is not None
    tables = set(inspect(db.engine).get_table_names())
    assert {"tunehub_sweeps", "tunehub_trials", "tunehub_trial_reports",
            "tunehub_model_versions", VERSION_TABLE} <= tables
    assert {"studies", "trials", "alembic_version"} <= tables  # Optuna's
