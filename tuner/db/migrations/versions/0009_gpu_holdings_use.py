"""Kubernetes GPU holdings: the measured use of each pod (used GPU-seconds and its figures)

Revision ID: 0009
Revises: 0008
"""
from alembic import op
import sqlalchemy as sa


revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('tunehub_gpu_holdings') as batch:
        batch.add_column(sa.Column('used_seconds', sa.Float(), nullable=False,
                                   server_default='0'))
        batch.add_column(sa.Column('use', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('tunehub_gpu_holdings') as batch:
        batch.drop_column('use')
        batch.drop_column('used_seconds')
