"""a sweep's controller claim records the address its tuner takes reports on, so another
replica can route a trial's report to it

Revision ID: 0007
Revises: 0006
"""
from alembic import op
import sqlalchemy as sa


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('tunehub_sweeps') as batch:
        batch.add_column(sa.Column('controller_url', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('tunehub_sweeps') as batch:
        batch.drop_column('controller_url')
