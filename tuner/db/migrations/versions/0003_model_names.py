"""model names are claimed by one owner (reserved at a sweep's submission)

Revision ID: 0003
Revises: 0002
"""
from alembic import op
import sqlalchemy as sa


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'tunehub_model_names',
        sa.Column('name', sa.String(64), primary_key=True),
        sa.Column('owner', sa.String(255), nullable=False, index=True),
        sa.Column('created_at', sa.DateTime(), nullable=True),
    )
    # Names registered before: the owner of each name's first version keeps it.
    op.execute(
        "INSERT INTO tunehub_model_names (name, owner, created_at) "
        "SELECT v.model, v.owner, v.created_at FROM tunehub_model_versions v "
        "WHERE v.id = (SELECT MIN(w.id) FROM tunehub_model_versions w WHERE w.model = v.model)"
    )


def downgrade() -> None:
    op.drop_table('tunehub_model_names')
