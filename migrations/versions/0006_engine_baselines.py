"""engine baselines: a pair's acceptance, equivalence and throughput measured in a serving engine

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 15:30:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('engine_baselines',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('pair_version_id', sa.Integer(), nullable=False),
    sa.Column('engine', sa.String(length=16), nullable=False),
    sa.Column('engine_version', sa.String(length=64), nullable=False),
    sa.Column('engine_build', sa.String(length=255), nullable=False),
    sa.Column('source', sa.Text(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('golden_set', sa.String(length=255), nullable=False),
    sa.Column('golden_sha256', sa.String(length=64), nullable=False),
    sa.Column('binding_sha256', sa.String(length=64), nullable=False),
    sa.Column('validation_run_id', sa.Integer(), nullable=True),
    sa.Column('baselines', sa.JSON(), nullable=False),
    sa.Column('report', sa.JSON(), nullable=False),
    sa.Column('actor', sa.String(length=255), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.ForeignKeyConstraint(['pair_version_id'], ['pair_versions.id'], ondelete='RESTRICT'),
    sa.ForeignKeyConstraint(['validation_run_id'], ['validation_runs.id'], ondelete='RESTRICT'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('engine_baselines', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_engine_baselines_pair_version_id'), ['pair_version_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('engine_baselines', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_engine_baselines_pair_version_id'))

    op.drop_table('engine_baselines')
