"""The tunehub database: one SQLAlchemy engine, migrated by Alembic, shared with Optuna."""

from tuner.db.engine import Database
from tuner.db.models import (
    Base,
    ModelVersion,
    SweepRow,
    Trial,
    TrialReport,
    utcnow,
)

__all__ = [
    "Database",
    "Base",
    "SweepRow",
    "Trial",
    "TrialReport",
    "ModelVersion",
    "utcnow",
]
