"""approver_keys (the approvers' keyring) and signed approvals

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 16:10:00

An approval counts only with a DSSE signature by a key enrolled to its approver:
``approvals.signature`` holds the Sigstore bundle, ``key_id`` the signing key, ``scope`` the
environment it was given for (``*``: any). Rows written before have no signature and no longer
count; their approvers sign again with `specreg approve`. ``pair_versions.model_files``: every
file of each model directory at registration (NULL for versions registered before).
``session_role`` (PostgreSQL): the role that wrote each audit event, approval and keyring row,
stamped server-side and covered by the event hash. A downgrade below 0005 drops
those roles, so on PostgreSQL the events written since no longer verify.
"""
from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None
STAMPED = ('audit_events', 'approvals', 'approver_keys')


def upgrade() -> None:
    op.create_table(
        'approver_keys',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('person', sa.String(length=255), nullable=False),
        sa.Column('key_id', sa.String(length=64), nullable=False),
        sa.Column('public_key', sa.Text(), nullable=False),
        sa.Column('enrolled_by', sa.String(length=255), nullable=False),
        sa.Column('enrolled_at', sa.DateTime(), nullable=False),
        sa.Column('event_hash', sa.String(length=64), nullable=True),
        sa.Column('session_role', sa.String(length=255), nullable=True),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('key_id', name='uq_approver_keys_key_id'),
    )
    with op.batch_alter_table('approvals', schema=None) as batch_op:
        batch_op.add_column(sa.Column('signature', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('key_id', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('scope', sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column('session_role', sa.String(length=255), nullable=True))
    with op.batch_alter_table('audit_events', schema=None) as batch_op:
        batch_op.add_column(sa.Column('session_role', sa.String(length=255), nullable=True))
    with op.batch_alter_table('pair_versions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('model_files', sa.JSON(), nullable=True))
    if op.get_bind().dialect.name == 'postgresql':
        # The role that writes a row is stamped by the server, not sent by the client: a column
        # default and a trigger owned by the schema owner (who runs this migration). A user role
        # can neither drop nor disable them (that needs ownership of the table).
        op.execute("CREATE OR REPLACE FUNCTION specreg_stamp_session_role() RETURNS trigger LANGUAGE plpgsql AS "
                   "$$ BEGIN NEW.session_role := session_user; RETURN NEW; END $$")
        for table in STAMPED:
            op.execute(f"ALTER TABLE {table} ALTER COLUMN session_role SET DEFAULT session_user")
            op.execute(f"CREATE TRIGGER specreg_stamp_session_role BEFORE INSERT OR UPDATE ON {table} "
                       f"FOR EACH ROW EXECUTE FUNCTION specreg_stamp_session_role()")


def downgrade() -> None:
    if op.get_bind().dialect.name == 'postgresql':
        for table in STAMPED:
            op.execute(f"DROP TRIGGER IF EXISTS specreg_stamp_session_role ON {table}")
        op.execute("DROP FUNCTION IF EXISTS specreg_stamp_session_role()")
    with op.batch_alter_table('pair_versions', schema=None) as batch_op:
        batch_op.drop_column('model_files')
    with op.batch_alter_table('audit_events', schema=None) as batch_op:
        batch_op.drop_column('session_role')
    with op.batch_alter_table('approvals', schema=None) as batch_op:
        batch_op.drop_column('session_role')
        batch_op.drop_column('scope')
        batch_op.drop_column('key_id')
        batch_op.drop_column('signature')
    op.drop_table('approver_keys')
