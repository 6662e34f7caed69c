"""queued media jobs (video, audio)

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23 20:30:00.000000
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def _text(length: int) -> sqlmodel.sql.sqltypes.AutoString:
    return sqlmodel.sql.sqltypes.AutoString(length=length)


def upgrade() -> None:
    op.create_table('media_jobs',
    sa.Column('queue_id', _text(36), nullable=False),
    sa.Column('kind', _text(16), nullable=False),
    sa.Column('model_id', _text(128), nullable=False),
    sa.Column('status', _text(16), nullable=False),
    sa.Column('request_id', _text(64), nullable=False),
    sa.Column('account_id', _text(36), nullable=False),
    sa.Column('api_key_id', _text(36), nullable=True),
    sa.Column('wallet_address', _text(128), nullable=True),
    sa.Column('params', sa.JSON(), nullable=False),
    sa.Column('inputs', sa.JSON(), nullable=False),
    sa.Column('cost_lines', sa.JSON(), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('lease_owner', _text(64), nullable=True),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('result_key', _text(255), nullable=True),
    sa.Column('media_type', _text(64), nullable=True),
    sa.Column('error_status', sa.Integer(), nullable=True),
    sa.Column('error_code', _text(64), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('media_deleted', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('queue_id'),
    sa.UniqueConstraint('request_id')
    )
    with op.batch_alter_table('media_jobs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_media_jobs_account_id'), ['account_id'],
                              unique=False)
        batch_op.create_index('ix_media_jobs_status_created', ['status', 'created_at'],
                              unique=False)
        batch_op.create_index('ix_media_jobs_model_finished', ['model_id', 'finished_at'],
                              unique=False)


def downgrade() -> None:
    with op.batch_alter_table('media_jobs', schema=None) as batch_op:
        batch_op.drop_index('ix_media_jobs_model_finished')
        batch_op.drop_index('ix_media_jobs_status_created')
        batch_op.drop_index(batch_op.f('ix_media_jobs_account_id'))
    op.drop_table('media_jobs')
