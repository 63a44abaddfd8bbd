"""pair kinds that draft from the target's hidden states: candidate tree and head description

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 03:40:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('pair_versions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('tree', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('head', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('pair_versions', schema=None) as batch_op:
        batch_op.drop_column('head')
        batch_op.drop_column('tree')
