"""a sweep's controller claim records its process's start, so a reused pid is not taken for it

Revision ID: 0005
Revises: 0004
"""
from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('tunehub_sweeps') as batch:
        batch.add_column(sa.Column('controller_start', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('tunehub_sweeps') as batch:
        batch.drop_column('controller_start')
