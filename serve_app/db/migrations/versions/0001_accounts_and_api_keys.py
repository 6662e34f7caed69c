"""accounts and api keys

Revision ID: 0001
Revises:
Create Date: 2026-11-21 23:55:18.219581
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('accounts',
    sa.Column('id', sqlmodel.sql.sqltypes.AutoString(length=36), nullable=False),
    sa.Column('kind', sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
    sa.Column('wallet_address', sqlmodel.sql.sqltypes.AutoString(length=128), nullable=True),
    sa.Column('usd_balance_nanos', sa.BigInteger(), nullable=False),
    sa.Column('diem_balance_nanos', sa.BigInteger(), nullable=False),
    sa.Column('is_partner', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('wallet_address')
    )
    op.create_table('api_keys',
    sa.Column('id', sqlmodel.sql.sqltypes.AutoString(length=36), nullable=False),
    sa.Column('account_id', sqlmodel.sql.sqltypes.AutoString(length=36), nullable=False),
    sa.Column('key_hash', sa.String(length=64), nullable=False),
    sa.Column('last6', sqlmodel.sql.sqltypes.AutoString(length=6), nullable=False),
    sa.Column('key_type', sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
    sa.Column('description', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('limit_usd_nanos', sa.BigInteger(), nullable=True),
    sa.Column('limit_diem_nanos', sa.BigInteger(), nullable=True),
    sa.Column('limit_vcu_nanos', sa.BigInteger(), nullable=True),
    sa.Column('limit_period', sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
    sa.Column('model_privacy', sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_used_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('deleted_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('api_keys', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_api_keys_account_id'), ['account_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_api_keys_key_hash'), ['key_hash'], unique=True)
        batch_op.create_index(batch_op.f('ix_api_keys_updated_at'), ['updated_at'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('api_keys', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_api_keys_updated_at'))
        batch_op.drop_index(batch_op.f('ix_api_keys_key_hash'))
        batch_op.drop_index(batch_op.f('ix_api_keys_account_id'))

    op.drop_table('api_keys')
    op.drop_table('accounts')
