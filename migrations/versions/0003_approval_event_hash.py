"""approvals.event_hash: each decision points at the audit event that recorded it

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 03:40:00

Existing approvals are linked to their event where the chain has one that names them
(``details.approval`` = the approval's id, same decision); any other row stays NULL and no
longer counts as a decision (it was never recorded in the audit log).
"""
from alembic import op
import sqlalchemy as sa


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('approvals', schema=None) as batch_op:
        batch_op.add_column(sa.Column('event_hash', sa.String(length=64), nullable=True))

    connection = op.get_bind()
    events = sa.table('audit_events', sa.column('id', sa.Integer), sa.column('action', sa.String),
                      sa.column('details', sa.JSON), sa.column('event_hash', sa.String))
    approvals = sa.table('approvals', sa.column('id', sa.Integer), sa.column('decision', sa.String),
                         sa.column('event_hash', sa.String))
    decided = {row.id: row.decision for row in connection.execute(sa.select(approvals.c.id, approvals.c.decision))}
    for event in connection.execute(sa.select(events.c.action, events.c.details, events.c.event_hash)
                                    .where(events.c.action.in_(('approve', 'reject'))).order_by(events.c.id)):
        details = event.details or {}
        approval_id = details.get('approval')
        if decided.get(approval_id) is not None and decided[approval_id] == details.get('decision'):
            connection.execute(approvals.update().where(approvals.c.id == approval_id)
                               .values(event_hash=event.event_hash))


def downgrade() -> None:
    with op.batch_alter_table('approvals', schema=None) as batch_op:
        batch_op.drop_column('event_hash')
