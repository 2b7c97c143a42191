"""Sweeps: the submitting request's Idempotency-Key, unique per owner

Revision ID: 0011
Revises: 0010
"""
from alembic import op
import sqlalchemy as sa


revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('tunehub_sweeps') as batch:
        batch.add_column(sa.Column('request_key', sa.String(length=64), nullable=True))
    op.create_index('uq_tunehub_sweep_request', 'tunehub_sweeps', ['owner', 'request_key'],
                    unique=True)


def downgrade() -> None:
    op.drop_index('uq_tunehub_sweep_request', table_name='tunehub_sweeps')
    with op.batch_alter_table('tunehub_sweeps') as batch:
        batch.drop_column('request_key')
