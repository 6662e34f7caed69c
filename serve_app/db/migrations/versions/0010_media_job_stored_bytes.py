"""media jobs count the bytes they keep in the result store (per-account caps)

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25 12:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('media_jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('stored_bytes', sa.BigInteger(), nullable=False,
                                      server_default='0'))


def downgrade() -> None:
    with op.batch_alter_table('media_jobs', schema=None) as batch_op:
        batch_op.drop_column('stored_bytes')
