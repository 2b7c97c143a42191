"""Kubernetes GPU holdings: the hub groups the holder was a member of when the pod started

Revision ID: 0010
Revises: 0009
"""
from alembic import op
import sqlalchemy as sa


revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('tunehub_gpu_holdings') as batch:
        batch.add_column(sa.Column('groups', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('tunehub_gpu_holdings') as batch:
        batch.drop_column('groups')
