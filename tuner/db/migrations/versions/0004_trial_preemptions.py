"""trials count their preempted attempts (not retries)

Revision ID: 0004
Revises: 0003
"""
from alembic import op
import sqlalchemy as sa


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('tunehub_trials') as batch:
        batch.add_column(sa.Column('preemptions', sa.Integer(), nullable=False,
                                   server_default='0'))


def downgrade() -> None:
    with op.batch_alter_table('tunehub_trials') as batch:
        batch.drop_column('preemptions')
