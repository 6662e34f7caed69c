"""SIGN-IN-WITH-X nonces: used once on every replica sharing the database, kept in sessions
of their own (not the money writer), and gone once their message has expired."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, select
from sqlmodel import Session

from serve_app.db.engine import make_engine
from serve_app.db.tables import SiwxNonce, utcnow
from serve_app.errors import ApiError
from serve_app.wallets.nonces import SWEEP_MARGIN, sweep_nonces, use_nonce
from serve_app.wallets.siwx import SignIn

ADDRESS = "0x" + "ab" * 20


def _sign_in(nonce: str, expires_in: timedelta) -> SignIn:
    now = utcnow()
    return SignIn(address=ADDRESS, chain_id="eip155:8453", family="evm", nonce=nonce,
                  issued_at=now - timedelta(minutes=1), expires_at=now + expires_in)


@pytest.fixture
def engine(database_url: str):
    engine = make_engine(database_url)
    yield engine
    engine.dispose()


def _nonces(engine) -> int:
    with Session(engine) as session:
        return session.execute(select(func.count()).select_from(SiwxNonce)).scalar_one()


def test_a_nonce_is_used_once_from_any_session(engine) -> None:
    with Session(engine) as session:
        use_nonce(session, _sign_in("a1b2c3d4e5f60718", timedelta(minutes=10)))
    with Session(engine) as session, pytest.raises(ApiError) as refused:
        use_nonce(session, _sign_in("a1b2c3d4e5f60718", timedelta(minutes=10)))
    assert refused.value.status == 401
    assert refused.value.message == "This nonce has already been used"


async def test_every_stored_nonce_expires_with_its_message(engine) -> None:
    with Session(engine) as session:
        use_nonce(session, _sign_in("expiredexpired01", -SWEEP_MARGIN - timedelta(seconds=1)))
        use_nonce(session, _sign_in("liveliveliveli01", timedelta(minutes=10)))
    assert await sweep_nonces(engine) == 1
    assert _nonces(engine) == 1
