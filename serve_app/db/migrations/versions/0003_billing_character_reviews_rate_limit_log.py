"""billing, character reviews, rate limit log

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 02:28:55.433638
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('key_spend_windows',
    sa.Column('api_key_id', sqlmodel.sql.sqltypes.AutoString(length=36), nullable=False),
    sa.Column('window_start', sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
    sa.Column('usd_nanos', sa.BigInteger(), nullable=False),
    sa.Column('diem_nanos', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('api_key_id', 'window_start')
    )
    op.create_table('rate_limit_events',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('account_id', sqlmodel.sql.sqltypes.AutoString(length=36), nullable=False),
    sa.Column('api_key_id', sqlmodel.sql.sqltypes.AutoString(length=36), nullable=True),
    sa.Column('model_id', sqlmodel.sql.sqltypes.AutoString(length=200), nullable=True),
    sa.Column('tier', sqlmodel.sql.sqltypes.AutoString(length=32), nullable=False),
    sa.Column('limit_type', sqlmodel.sql.sqltypes.AutoString(length=32), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('rate_limit_events', schema=None) as batch_op:
        batch_op.create_index('ix_rate_limit_events_account_time', ['account_id', 'created_at'], unique=False)

    op.create_table('server_secrets',
    sa.Column('name', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('value', sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
    sa.PrimaryKeyConstraint('name')
    )
    op.create_table('usage_daily',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('account_id', sqlmodel.sql.sqltypes.AutoString(length=36), nullable=False),
    sa.Column('day', sa.Date(), nullable=False),
    sa.Column('api_key_id', sqlmodel.sql.sqltypes.AutoString(length=36), nullable=False),
    sa.Column('model_id', sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
    sa.Column('model_type', sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
    sa.Column('line_type', sqlmodel.sql.sqltypes.AutoString(length=32), nullable=False),
    sa.Column('usd_nanos', sa.BigInteger(), nullable=False),
    sa.Column('diem_nanos', sa.BigInteger(), nullable=False),
    sa.Column('units', sa.BigInteger(), nullable=False),
    sa.Column('requests', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('account_id', 'day', 'api_key_id', 'model_id', 'line_type', name='uq_usage_daily')
    )
    op.create_table('character_reviews',
    sa.Column('id', sqlmodel.sql.sqltypes.AutoString(length=36), nullable=False),
    sa.Column('character_id', sqlmodel.sql.sqltypes.AutoString(length=36), nullable=False),
    sa.Column('account_id', sqlmodel.sql.sqltypes.AutoString(length=36), nullable=True),
    sa.Column('username', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('rating', sa.Integer(), nullable=False),
    sa.Column('message', sqlmodel.sql.sqltypes.AutoString(length=4000), nullable=True),
    sa.Column('locale', sqlmodel.sql.sqltypes.AutoString(length=16), nullable=True),
    sa.Column('user_avatar_url', sqlmodel.sql.sqltypes.AutoString(length=500), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['character_id'], ['characters.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('character_reviews', schema=None) as batch_op:
        batch_op.create_index('ix_character_reviews_character_time', ['character_id', 'created_at'], unique=False)

    op.create_table('ledger_entries',
    sa.Column('request_id', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('account_id', sqlmodel.sql.sqltypes.AutoString(length=36), nullable=False),
    sa.Column('api_key_id', sqlmodel.sql.sqltypes.AutoString(length=36), nullable=True),
    sa.Column('wallet_address', sqlmodel.sql.sqltypes.AutoString(length=128), nullable=True),
    sa.Column('model_id', sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
    sa.Column('model_type', sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
    sa.Column('unit_type', sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
    sa.Column('units', sa.JSON(), nullable=False),
    sa.Column('usd_nanos', sa.BigInteger(), nullable=False),
    sa.Column('diem_nanos', sa.BigInteger(), nullable=False),
    sa.Column('execution_ms', sa.Integer(), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], ),
    sa.PrimaryKeyConstraint('request_id')
    )
    op.create_table('reservations',
    sa.Column('request_id', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('account_id', sqlmodel.sql.sqltypes.AutoString(length=36), nullable=False),
    sa.Column('api_key_id', sqlmodel.sql.sqltypes.AutoString(length=36), nullable=True),
    sa.Column('window_start', sqlmodel.sql.sqltypes.AutoString(length=16), nullable=True),
    sa.Column('usd_nanos', sa.BigInteger(), nullable=False),
    sa.Column('diem_nanos', sa.BigInteger(), nullable=False),
    sa.Column('diem_epoch', sqlmodel.sql.sqltypes.AutoString(length=10), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], ),
    sa.PrimaryKeyConstraint('request_id')
    )
    with op.batch_alter_table('reservations', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_reservations_account_id'), ['account_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_reservations_created_at'), ['created_at'], unique=False)

    op.create_table('ledger_lines',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('request_id', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('account_id', sqlmodel.sql.sqltypes.AutoString(length=36), nullable=False),
    sa.Column('api_key_id', sqlmodel.sql.sqltypes.AutoString(length=36), nullable=True),
    sa.Column('model_id', sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
    sa.Column('line_type', sqlmodel.sql.sqltypes.AutoString(length=32), nullable=False),
    sa.Column('sku', sqlmodel.sql.sqltypes.AutoString(length=256), nullable=False),
    sa.Column('currency', sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
    sa.Column('units', sa.BigInteger(), nullable=False),
    sa.Column('amount_nanos', sa.BigInteger(), nullable=False),
    sa.Column('price_per_unit_usd', sa.Float(), nullable=False),
    sa.Column('prompt_tokens', sa.Integer(), nullable=True),
    sa.Column('completion_tokens', sa.Integer(), nullable=True),
    sa.Column('execution_ms', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['request_id'], ['ledger_entries.request_id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('ledger_lines', schema=None) as batch_op:
        batch_op.create_index('ix_ledger_lines_account_time', ['account_id', 'created_at', 'id'], unique=False)
        batch_op.create_index(batch_op.f('ix_ledger_lines_request_id'), ['request_id'], unique=False)

    with op.batch_alter_table('accounts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('staked_tokens', sa.BigInteger(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('diem_epoch', sqlmodel.sql.sqltypes.AutoString(length=10), nullable=True))

    with op.batch_alter_table('characters', schema=None) as batch_op:
        batch_op.add_column(sa.Column('author', sqlmodel.sql.sqltypes.AutoString(length=64), server_default='', nullable=False))
        batch_op.add_column(sa.Column('tags', sa.JSON(), server_default='[]', nullable=False))
        batch_op.add_column(sa.Column('photo_url', sqlmodel.sql.sqltypes.AutoString(length=500), nullable=True))
        batch_op.add_column(sa.Column('adult', sa.Boolean(), server_default=sa.false(), nullable=False))
        batch_op.add_column(sa.Column('web_enabled', sa.Boolean(), server_default=sa.false(), nullable=False))
        batch_op.add_column(sa.Column('featured', sa.Boolean(), server_default=sa.false(), nullable=False))
        batch_op.add_column(sa.Column('model_id', sqlmodel.sql.sqltypes.AutoString(length=200), nullable=True))
        batch_op.add_column(sa.Column('updated_at', sa.DateTime(timezone=True),
                                      server_default=sa.text('CURRENT_TIMESTAMP'), nullable=False))



def downgrade() -> None:
    with op.batch_alter_table('characters', schema=None) as batch_op:
        batch_op.drop_column('updated_at')
        batch_op.drop_column('model_id')
        batch_op.drop_column('featured')
        batch_op.drop_column('web_enabled')
        batch_op.drop_column('adult')
        batch_op.drop_column('photo_url')
        batch_op.drop_column('tags')
        batch_op.drop_column('author')

    with op.batch_alter_table('accounts', schema=None) as batch_op:
        batch_op.drop_column('diem_epoch')
        batch_op.drop_column('staked_tokens')

    with op.batch_alter_table('ledger_lines', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_ledger_lines_request_id'))
        batch_op.drop_index('ix_ledger_lines_account_time')

    op.drop_table('ledger_lines')
    with op.batch_alter_table('reservations', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_reservations_created_at'))
        batch_op.drop_index(batch_op.f('ix_reservations_account_id'))

    op.drop_table('reservations')
    op.drop_table('ledger_entries')
    with op.batch_alter_table('character_reviews', schema=None) as batch_op:
        batch_op.drop_index('ix_character_reviews_character_time')

    op.drop_table('character_reviews')
    op.drop_table('usage_daily')
    op.drop_table('server_secrets')
    with op.batch_alter_table('rate_limit_events', schema=None) as batch_op:
        batch_op.drop_index('ix_rate_limit_events_account_time')

    op.drop_table('rate_limit_events')
    op.drop_table('key_spend_windows')
