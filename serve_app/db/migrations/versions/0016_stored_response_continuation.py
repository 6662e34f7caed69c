"""background responses: what another replica needs to continue one whose worker died

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02 10:45:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('stored_responses', schema=None) as batch_op:
        batch_op.add_column(sa.Column('continuation', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('stored_responses', schema=None) as batch_op:
        batch_op.drop_column('continuation')
