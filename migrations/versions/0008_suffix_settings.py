"""suffix decoding pairs: vLLM's suffix_decoding_* settings

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 09:00:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('pair_versions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('suffix', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('pair_versions', schema=None) as batch_op:
        batch_op.drop_column('suffix')
