"""holds name the billing service that took them, which beats while it lives

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23 23:55:00.000000
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('billing_holders',
    sa.Column('id', sqlmodel.sql.sqltypes.AutoString(length=36), nullable=False),
    sa.Column('seen_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('reservations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('holder', sqlmodel.sql.sqltypes.AutoString(length=36),
                                      nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('reservations', schema=None) as batch_op:
        batch_op.drop_column('holder')
    op.drop_table('billing_holders')
