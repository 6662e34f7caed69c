"""webhook secrets keep the one a rotation replaced, and until when it still signs

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02 05:00:00.000000
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('webhook_secrets', schema=None) as batch_op:
        batch_op.add_column(sa.Column('previous_secret',
                                      sqlmodel.sql.sqltypes.AutoString(length=128),
                                      nullable=True))
        batch_op.add_column(sa.Column('previous_until', sa.DateTime(timezone=True),
                                      nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('webhook_secrets', schema=None) as batch_op:
        batch_op.drop_column('previous_until')
        batch_op.drop_column('previous_secret')
