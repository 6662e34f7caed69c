"""SIGN-IN-WITH-X nonces already used: each signed sign-in is good for one request, on every
replica and node that shares the database.

The bookkeeping runs in sessions of its own (`siwx_nonces`), never on the money writer: a
flood of sign-ins does not queue behind, or in front of, holds and settlements. Every row
carries its message's expiry and is swept once that has passed (a replayed expired message is
refused by its expiry already), so nothing a sign-in stores outlives its message.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from sqlalchemy import delete
from sqlalchemy.engine import Engine
from sqlmodel import Session

from serve_app.db.engine import dialect_insert, run_in_session
from serve_app.db.tables import SiwxNonce, utcnow
from serve_app.errors import ApiError
from serve_app.wallets.siwx import SignIn

logger = logging.getLogger("serve_app.auth")

SWEEP_INTERVAL_S = 300.0
# A nonce outlives its message by this much, for replicas whose clocks differ.
SWEEP_MARGIN = timedelta(minutes=5)


def nonce_used() -> ApiError:
    return ApiError(401, "This nonce has already been used", code="AUTHENTICATION_FAILED")


def use_nonce(session: Session, sign_in: SignIn) -> None:
    """Record the sign-in's nonce and commit, or refuse a second use (401)."""
    stmt = (dialect_insert(session)(SiwxNonce)
            .values(address=sign_in.address, nonce=sign_in.nonce, expires_at=sign_in.expires_at)
            .on_conflict_do_nothing(index_elements=["address", "nonce"])
            .returning(SiwxNonce.nonce))
    if session.execute(stmt).first() is None:
        raise nonce_used()
    session.commit()


async def sweep_nonces(engine: Engine) -> int:
    """Delete the nonces of messages expired (with the margin); returns how many."""
    cutoff = utcnow() - SWEEP_MARGIN

    def sweep(session: Session) -> int:
        result = session.execute(delete(SiwxNonce).where(SiwxNonce.expires_at < cutoff))
        session.commit()
        return result.rowcount or 0

    return await run_in_session(engine, sweep)


async def run_nonce_sweeper(engine: Engine, interval_s: float = SWEEP_INTERVAL_S) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            await sweep_nonces(engine)
        except Exception:
            logger.exception("sweeping expired SIWX nonces failed")
