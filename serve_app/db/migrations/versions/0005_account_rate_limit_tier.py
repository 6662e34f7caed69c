"""account rate-limit tier

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 12:50:00.000000
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Existing accounts get the default tier (configs/rate_limit_tiers.yaml).
    with op.batch_alter_table('accounts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('rate_limit_tier', sqlmodel.sql.sqltypes.AutoString(length=32),
                                      server_default='default', nullable=False))


def downgrade() -> None:
    with op.batch_alter_table('accounts', schema=None) as batch_op:
        batch_op.drop_column('rate_limit_tier')
