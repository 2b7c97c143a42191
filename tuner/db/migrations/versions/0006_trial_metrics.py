"""every metric a trial reported and the serving figures tunehub measured, on the trial and on
the model version chosen from it (promotion under a budget, multi-objective sweeps); each
version's moves between stages with their reasons (canary release)

Revision ID: 0006
Revises: 0005
"""
from alembic import op
import sqlalchemy as sa


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('tunehub_trials') as batch:
        batch.add_column(sa.Column('metrics', sa.JSON(), nullable=True))
    with op.batch_alter_table('tunehub_model_versions') as batch:
        batch.add_column(sa.Column('metrics', sa.JSON(), nullable=True))
        batch.add_column(sa.Column('history', sa.JSON(), nullable=True))
        batch.add_column(sa.Column('code_digest', sa.String(length=80), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('tunehub_model_versions') as batch:
        batch.drop_column('code_digest')
        batch.drop_column('history')
        batch.drop_column('metrics')
    with op.batch_alter_table('tunehub_trials') as batch:
        batch.drop_column('metrics')
