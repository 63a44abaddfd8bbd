"""policy of record: the promotion policy as versioned documents in the registry

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 05:00:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('policy_versions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('document', sa.Text(), nullable=False),
    sa.Column('format', sa.String(length=8), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('proposed_by', sa.String(length=255), nullable=False),
    sa.Column('proposed_at', sa.DateTime(), nullable=False),
    sa.Column('note', sa.Text(), nullable=True),
    sa.Column('event_hash', sa.String(length=64), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('version', name='uq_policy_versions_version')
    )


def downgrade() -> None:
    op.drop_table('policy_versions')
