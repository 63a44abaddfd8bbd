"""initial schema: pairs, pair versions, audit log

Revision ID: 0001
Revises: 
Create Date: 2026-11-29 09:12:26.775080
"""
from alembic import op
import sqlalchemy as sa


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('audit_events',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('pair_name', sa.String(length=64), nullable=False),
    sa.Column('version', sa.Integer(), nullable=True),
    sa.Column('action', sa.String(length=32), nullable=False),
    sa.Column('from_state', sa.String(length=32), nullable=True),
    sa.Column('to_state', sa.String(length=32), nullable=True),
    sa.Column('actor', sa.String(length=255), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('details', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('prev_hash', sa.String(length=64), nullable=False),
    sa.Column('event_hash', sa.String(length=64), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('event_hash')
    )
    with op.batch_alter_table('audit_events', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_audit_events_pair_name'), ['pair_name'], unique=False)

    op.create_table('audit_head',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('last_hash', sa.String(length=64), nullable=False),
    sa.Column('last_event_id', sa.Integer(), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('pairs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('name')
    )
    op.create_table('pair_versions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('pair_id', sa.Integer(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('binding_sha256', sa.String(length=64), nullable=False),
    sa.Column('method', sa.String(length=32), nullable=False),
    sa.Column('num_speculative_tokens', sa.Integer(), nullable=False),
    sa.Column('prompt_lookup_min', sa.Integer(), nullable=True),
    sa.Column('prompt_lookup_max', sa.Integer(), nullable=True),
    sa.Column('max_batch_size_for_speculation', sa.Integer(), nullable=True),
    sa.Column('target', sa.JSON(), nullable=False),
    sa.Column('draft', sa.JSON(), nullable=True),
    sa.Column('registered_by', sa.String(length=255), nullable=False),
    sa.Column('registered_at', sa.DateTime(), nullable=False),
    sa.Column('notes', sa.Text(), nullable=True),
    sa.Column('allow_pickle', sa.Boolean(), nullable=False),
    sa.ForeignKeyConstraint(['pair_id'], ['pairs.id'], ondelete='RESTRICT'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('pair_id', 'binding_sha256', name='uq_pair_versions_pair_binding'),
    sa.UniqueConstraint('pair_id', 'version', name='uq_pair_versions_pair_version')
    )
    with op.batch_alter_table('pair_versions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_pair_versions_pair_id'), ['pair_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('pair_versions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_pair_versions_pair_id'))

    op.drop_table('pair_versions')
    op.drop_table('pairs')
    op.drop_table('audit_head')
    with op.batch_alter_table('audit_events', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_audit_events_pair_name'))

    op.drop_table('audit_events')
