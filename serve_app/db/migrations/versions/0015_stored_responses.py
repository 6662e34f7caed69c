"""background responses: their objects, leases and numbered events

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02 07:40:00.000000
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('stored_responses',
    sa.Column('id', sqlmodel.sql.sqltypes.AutoString(length=48), nullable=False),
    sa.Column('account_id', sqlmodel.sql.sqltypes.AutoString(length=36), nullable=False),
    sa.Column('request_id', sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
    sa.Column('status', sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
    sa.Column('response', sa.Text(), nullable=False),
    sa.Column('stored_bytes', sa.BigInteger(), nullable=False),
    sa.Column('lease_owner', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('cancel_requested', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('stored_responses', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_stored_responses_account_id'), ['account_id'],
                              unique=False)
        batch_op.create_index(batch_op.f('ix_stored_responses_expires_at'), ['expires_at'],
                              unique=False)
    op.create_table('response_events',
    sa.Column('response_id', sqlmodel.sql.sqltypes.AutoString(length=48), nullable=False),
    sa.Column('sequence_number', sa.Integer(), autoincrement=False, nullable=False),
    sa.Column('data', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('response_id', 'sequence_number')
    )


def downgrade() -> None:
    op.drop_table('response_events')
    with op.batch_alter_table('stored_responses', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_stored_responses_expires_at'))
        batch_op.drop_index(batch_op.f('ix_stored_responses_account_id'))
    op.drop_table('stored_responses')
