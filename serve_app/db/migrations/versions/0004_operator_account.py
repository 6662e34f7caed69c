"""operator account

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22 03:31:46.777692
"""

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('accounts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('is_operator', sa.Boolean(), server_default=sa.false(),
                                      nullable=False))
    # The operator's account is the first one, made by the first start.
    op.execute("UPDATE accounts SET is_operator = TRUE WHERE id = "
               "(SELECT id FROM accounts ORDER BY created_at LIMIT 1)")


def downgrade() -> None:
    with op.batch_alter_table('accounts', schema=None) as batch_op:
        batch_op.drop_column('is_operator')
