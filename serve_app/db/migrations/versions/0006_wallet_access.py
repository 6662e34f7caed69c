"""wallet access: SIWX nonces and x402 payments

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23 15:30:00.000000
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('siwx_nonces',
    sa.Column('address', sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
    sa.Column('nonce', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('address', 'nonce')
    )
    with op.batch_alter_table('siwx_nonces', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_siwx_nonces_expires_at'), ['expires_at'],
                              unique=False)

    op.create_table('x402_payments',
    sa.Column('payment_id', sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
    sa.Column('status', sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
    sa.Column('wallet_address', sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
    sa.Column('account_id', sqlmodel.sql.sqltypes.AutoString(length=36), nullable=True),
    sa.Column('network', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('amount_nanos', sa.BigInteger(), nullable=False),
    sa.Column('transaction', sqlmodel.sql.sqltypes.AutoString(length=200), nullable=True),
    sa.Column('balance_after_nanos', sa.BigInteger(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('credited_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('payment_id')
    )
    with op.batch_alter_table('x402_payments', schema=None) as batch_op:
        batch_op.create_index('ix_x402_payments_wallet_time', ['wallet_address', 'created_at'],
                              unique=False)


def downgrade() -> None:
    with op.batch_alter_table('x402_payments', schema=None) as batch_op:
        batch_op.drop_index('ix_x402_payments_wallet_time')
    op.drop_table('x402_payments')
    with op.batch_alter_table('siwx_nonces', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_siwx_nonces_expires_at'))
    op.drop_table('siwx_nonces')
