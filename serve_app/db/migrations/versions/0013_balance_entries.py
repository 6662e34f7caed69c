"""balance_entries: the journal of every balance change that is not a charge, opened with the
balance each account has

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02 04:20:00.000000
"""

from datetime import UTC, datetime

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def _string(length: int) -> sqlmodel.sql.sqltypes.AutoString:
    return sqlmodel.sql.sqltypes.AutoString(length=length)


def upgrade() -> None:
    entries = op.create_table('balance_entries',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('account_id', _string(36), nullable=False),
    sa.Column('kind', _string(32), nullable=False),
    sa.Column('usd_nanos', sa.BigInteger(), nullable=False),
    sa.Column('diem_nanos', sa.BigInteger(), nullable=False),
    sa.Column('source', _string(200), nullable=True),
    sa.Column('reason', _string(500), nullable=True),
    sa.Column('actor', _string(128), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('balance_entries', schema=None) as batch_op:
        batch_op.create_index('ix_balance_entries_account_time', ['account_id', 'created_at'],
                              unique=False)
    # The opening entry of each account: what makes its journal (this entry and its charges)
    # less its open holds equal the balance it has now.
    bind = op.get_bind()
    charged = {row[0]: (int(row[1]), int(row[2])) for row in bind.execute(sa.text(
        "SELECT account_id, COALESCE(SUM(usd_nanos), 0), COALESCE(SUM(diem_nanos), 0) "
        "FROM ledger_entries GROUP BY account_id"))}
    held = {row[0]: (int(row[1]), int(row[2])) for row in bind.execute(sa.text(
        "SELECT account_id, COALESCE(SUM(usd_nanos), 0), COALESCE(SUM(diem_nanos), 0) "
        "FROM reservations GROUP BY account_id"))}
    now = datetime.now(UTC)
    rows = []
    for account_id, usd, diem in bind.execute(sa.text(
            "SELECT id, usd_balance_nanos, diem_balance_nanos FROM accounts")):
        charged_usd, charged_diem = charged.get(account_id, (0, 0))
        held_usd, held_diem = held.get(account_id, (0, 0))
        rows.append({"account_id": account_id, "kind": "OPENING",
                     "usd_nanos": int(usd) + charged_usd + held_usd,
                     "diem_nanos": int(diem) + charged_diem + held_diem,
                     "source": "migration 0013", "created_at": now})
    if rows:
        op.bulk_insert(entries, rows)


def downgrade() -> None:
    with op.batch_alter_table('balance_entries', schema=None) as batch_op:
        batch_op.drop_index('ix_balance_entries_account_time')
    op.drop_table('balance_entries')
