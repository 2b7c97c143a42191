"""Alembic environment: runs on the connection tuner.db.Database hands over."""

from alembic import context

from tuner.db.engine import VERSION_TABLE, ours
from tuner.db.models import Base

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    version_table=VERSION_TABLE,
    include_name=ours,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
