"""crypto RPC idempotency keys

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23 16:20:00.000000
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('rpc_idempotency',
    sa.Column('account_id', sqlmodel.sql.sqltypes.AutoString(length=36), nullable=False),
    sa.Column('key', sqlmodel.sql.sqltypes.AutoString(length=255), nullable=False),
    sa.Column('body_sha256', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('done', sa.Boolean(), nullable=False),
    sa.Column('response', sa.Text(), nullable=True),
    sa.Column('credits', sa.Integer(), nullable=False),
    sa.Column('cost_usd', sqlmodel.sql.sqltypes.AutoString(length=32), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('account_id', 'key')
    )
    with op.batch_alter_table('rpc_idempotency', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_rpc_idempotency_created_at'), ['created_at'],
                              unique=False)


def downgrade() -> None:
    with op.batch_alter_table('rpc_idempotency', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_rpc_idempotency_created_at'))
    op.drop_table('rpc_idempotency')
