"""crypto RPC idempotency keys are kept per network

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26 10:00:00.000000

The table is a 24-hour cache of answers: it is made again with the network in its key (the
answers it held name no network, so none could be replayed for the right one).
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def _create(with_network: bool) -> None:
    network = [sa.Column('network', sqlmodel.sql.sqltypes.AutoString(length=64),
                         nullable=False)] if with_network else []
    op.create_table('rpc_idempotency',
    sa.Column('account_id', sqlmodel.sql.sqltypes.AutoString(length=36), nullable=False),
    *network,
    sa.Column('key', sqlmodel.sql.sqltypes.AutoString(length=255), nullable=False),
    sa.Column('body_sha256', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('done', sa.Boolean(), nullable=False),
    sa.Column('response', sa.Text(), nullable=True),
    sa.Column('credits', sa.Integer(), nullable=False),
    sa.Column('cost_usd', sqlmodel.sql.sqltypes.AutoString(length=32), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('account_id', *(['network'] if with_network else []), 'key')
    )
    with op.batch_alter_table('rpc_idempotency', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_rpc_idempotency_created_at'), ['created_at'],
                              unique=False)


def _drop() -> None:
    with op.batch_alter_table('rpc_idempotency', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_rpc_idempotency_created_at'))
    op.drop_table('rpc_idempotency')


def upgrade() -> None:
    _drop()
    _create(with_network=True)


def downgrade() -> None:
    _drop()
    _create(with_network=False)
