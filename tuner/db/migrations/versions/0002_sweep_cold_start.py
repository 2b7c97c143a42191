"""sweeps say why their trials start cold

Revision ID: 0002
Revises: 0001
"""
from alembic import op
import sqlalchemy as sa


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('tunehub_sweeps') as batch:
        batch.add_column(sa.Column('cold_start', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('tunehub_sweeps') as batch:
        batch.drop_column('cold_start')
