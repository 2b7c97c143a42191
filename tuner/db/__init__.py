"""The tunehub database: one SQLAlchemy engine, migrated by Alembic, shared with Optuna."""

from tuner.db.engine import Database
from tuner.db.models import (
    Base,
    ModelName,
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
    "ModelName",
    "ModelVersion",
    "utcnow",
]
