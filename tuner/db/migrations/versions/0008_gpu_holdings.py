"""Kubernetes GPU holdings: one row per pod that held GPUs (GPU-hours on a cluster)

Revision ID: 0008
Revises: 0007
"""
from alembic import op
import sqlalchemy as sa


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'tunehub_gpu_holdings',
        sa.Column('id', sa.Integer(), primary_key=True),
        sa.Column('pod_uid', sa.String(64), nullable=False, unique=True),
        sa.Column('pod', sa.String(253), nullable=False),
        sa.Column('person', sa.String(255), nullable=False, index=True),
        sa.Column('kind', sa.String(16), nullable=False),
        sa.Column('server', sa.String(255), nullable=True),
        sa.Column('sweep_id', sa.Integer(), nullable=True),
        sa.Column('trial', sa.Integer(), nullable=True),
        sa.Column('attempt', sa.Integer(), nullable=True),
        sa.Column('gpus', sa.Integer(), nullable=False),
        sa.Column('flavor', sa.String(253), nullable=True),
        sa.Column('start', sa.Float(), nullable=False),
        sa.Column('end', sa.Float(), nullable=True, index=True),
        sa.Column('stale', sa.Boolean(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table('tunehub_gpu_holdings')
