"""validation runs, check results, approvals, environment pointers, observations

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 09:16:56.691750
"""
from alembic import op
import sqlalchemy as sa


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('approvals',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('pair_version_id', sa.Integer(), nullable=False),
    sa.Column('decision', sa.String(length=16), nullable=False),
    sa.Column('actor', sa.String(length=255), nullable=False),
    sa.Column('note', sa.Text(), nullable=True),
    sa.Column('source', sa.String(length=16), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.ForeignKeyConstraint(['pair_version_id'], ['pair_versions.id'], ondelete='RESTRICT'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('approvals', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_approvals_pair_version_id'), ['pair_version_id'], unique=False)

    op.create_table('environment_pointers',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('pair_id', sa.Integer(), nullable=False),
    sa.Column('environment', sa.String(length=32), nullable=False),
    sa.Column('pair_version_id', sa.Integer(), nullable=True),
    sa.Column('previous_version_id', sa.Integer(), nullable=True),
    sa.Column('updated_by', sa.String(length=255), nullable=False),
    sa.Column('updated_at', sa.DateTime(), nullable=False),
    sa.ForeignKeyConstraint(['pair_id'], ['pairs.id'], ondelete='RESTRICT'),
    sa.ForeignKeyConstraint(['pair_version_id'], ['pair_versions.id'], ondelete='RESTRICT'),
    sa.ForeignKeyConstraint(['previous_version_id'], ['pair_versions.id'], ondelete='RESTRICT'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('pair_id', 'environment', name='uq_environment_pointers_pair_env')
    )
    op.create_table('observations',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('pair_version_id', sa.Integer(), nullable=False),
    sa.Column('environment', sa.String(length=32), nullable=True),
    sa.Column('engine', sa.String(length=16), nullable=False),
    sa.Column('url', sa.Text(), nullable=False),
    sa.Column('observed_at', sa.DateTime(), nullable=False),
    sa.Column('figures', sa.JSON(), nullable=False),
    sa.Column('verdict', sa.String(length=16), nullable=False),
    sa.ForeignKeyConstraint(['pair_version_id'], ['pair_versions.id'], ondelete='RESTRICT'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('observations', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_observations_pair_version_id'), ['pair_version_id'], unique=False)

    op.create_table('validation_runs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('pair_version_id', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('golden_set', sa.String(length=255), nullable=False),
    sa.Column('golden_sha256', sa.String(length=64), nullable=False),
    sa.Column('binding_sha256', sa.String(length=64), nullable=False),
    sa.Column('environment', sa.JSON(), nullable=False),
    sa.Column('options', sa.JSON(), nullable=False),
    sa.Column('summary', sa.JSON(), nullable=True),
    sa.Column('baselines', sa.JSON(), nullable=True),
    sa.Column('actor', sa.String(length=255), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=True),
    sa.Column('started_at', sa.DateTime(), nullable=False),
    sa.Column('finished_at', sa.DateTime(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('mlflow_run_id', sa.String(length=64), nullable=True),
    sa.ForeignKeyConstraint(['pair_version_id'], ['pair_versions.id'], ondelete='RESTRICT'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('validation_runs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_validation_runs_pair_version_id'), ['pair_version_id'], unique=False)

    op.create_table('check_results',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('validation_run_id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('status', sa.String(length=8), nullable=False),
    sa.Column('summary', sa.Text(), nullable=False),
    sa.Column('evidence', sa.JSON(), nullable=True),
    sa.Column('figures', sa.JSON(), nullable=True),
    sa.ForeignKeyConstraint(['validation_run_id'], ['validation_runs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('check_results', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_check_results_validation_run_id'), ['validation_run_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('check_results', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_check_results_validation_run_id'))

    op.drop_table('check_results')
    with op.batch_alter_table('validation_runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_validation_runs_pair_version_id'))

    op.drop_table('validation_runs')
    with op.batch_alter_table('observations', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_observations_pair_version_id'))

    op.drop_table('observations')
    op.drop_table('environment_pointers')
    with op.batch_alter_table('approvals', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_approvals_pair_version_id'))

    op.drop_table('approvals')
