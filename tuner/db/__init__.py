"""The tunehub database: one SQLAlchemy engine, migrated by Alembic, shared with Optuna."""

from tuner.db.engine import Database
from tuner.db.models import (
    Base,
    ModelVersion,
    Sweep,
    Trial,
    TrialReport,
    utcnow,
)

__all__ = [
    "Database",
    "Base",
    "Sweep",
    "Trial",
    "TrialReport",
    "ModelVersion",
    "utcnow",
]
