"""queue idempotency keys, webhook secrets and deliveries, media_jobs.callback_url

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27 10:00:00.000000
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def _string(length: int) -> sqlmodel.sql.sqltypes.AutoString:
    return sqlmodel.sql.sqltypes.AutoString(length=length)


def _when(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table('queue_idempotency',
    sa.Column('account_id', _string(36), nullable=False),
    sa.Column('key', _string(255), nullable=False),
    sa.Column('body_sha256', _string(64), nullable=False),
    sa.Column('done', sa.Boolean(), nullable=False),
    sa.Column('status_code', sa.Integer(), nullable=False),
    sa.Column('response', sa.Text(), nullable=True),
    _when('created_at'),
    _when('expires_at'),
    sa.PrimaryKeyConstraint('account_id', 'key')
    )
    with op.batch_alter_table('queue_idempotency', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_queue_idempotency_expires_at'), ['expires_at'],
                              unique=False)
    op.create_table('webhook_secrets',
    sa.Column('account_id', _string(36), nullable=False),
    sa.Column('secret', _string(128), nullable=False),
    _when('created_at'),
    sa.PrimaryKeyConstraint('account_id')
    )
    op.create_table('webhook_deliveries',
    sa.Column('id', _string(36), nullable=False),
    sa.Column('queue_id', _string(36), nullable=False),
    sa.Column('account_id', _string(36), nullable=False),
    sa.Column('url', _string(2048), nullable=False),
    sa.Column('payload', sa.Text(), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    _when('next_attempt_at', nullable=True),
    _when('delivered_at', nullable=True),
    sa.Column('last_error', _string(500), nullable=True),
    _when('created_at'),
    _when('expires_at'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('queue_id')
    )
    with op.batch_alter_table('webhook_deliveries', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_webhook_deliveries_next_attempt_at'),
                              ['next_attempt_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_webhook_deliveries_expires_at'), ['expires_at'],
                              unique=False)
    with op.batch_alter_table('media_jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('callback_url', _string(2048), nullable=True))
        batch_op.create_index(batch_op.f('ix_media_jobs_callback_url'), ['callback_url'],
                              unique=False)


def downgrade() -> None:
    with op.batch_alter_table('media_jobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_media_jobs_callback_url'))
        batch_op.drop_column('callback_url')
    with op.batch_alter_table('webhook_deliveries', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_webhook_deliveries_expires_at'))
        batch_op.drop_index(batch_op.f('ix_webhook_deliveries_next_attempt_at'))
    op.drop_table('webhook_deliveries')
    op.drop_table('webhook_secrets')
    with op.batch_alter_table('queue_idempotency', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_queue_idempotency_expires_at'))
    op.drop_table('queue_idempotency')
