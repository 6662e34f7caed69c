"""The rate-limit log keeps what its route can show, and nothing forever."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from sqlmodel import Session, select

from serve_app.accounts.key_store import KeyRecord
from serve_app.db.engine import make_engine
from serve_app.db.tables import RateLimitEvent
from serve_app.limits.backends import LocalLimiter
from serve_app.limits.rate_limits import LOG_EVENTS_DAYS, LOG_EVENTS_KEPT, RateLimits


def _key(account: str) -> KeyRecord:
    return KeyRecord(id=f"key-{account}", account_id=account, key_hash="h", key_type="INFERENCE",
                     description="", model_privacy="all", limit_period="DAY",
                     limit_usd_nanos=None, limit_diem_nanos=None, expires_at=None)


def _events(engine, account: str) -> list[RateLimitEvent]:
    with Session(engine) as session:
        return list(session.exec(select(RateLimitEvent)
                                 .where(RateLimitEvent.account_id == account)).all())


def test_an_account_hammering_its_limit_keeps_only_the_newest_events_and_old_ones_expire(
        database_url):
    engine = make_engine(database_url)
    now = [1_800_000_000.0]
    limits = RateLimits(LocalLimiter(), engine, clock=lambda: now[0])

    async def refuse(key: KeyRecord, times: int) -> None:
        for i in range(times):
            now[0] += 2
            # one event per model and second is logged: a model each, so that none is skipped
            limits._log(key, f"model-{i}", "paid", "RPM")
            for task in list(limits._tasks):  # one refusal after the other
                await task

    async def scenario() -> None:
        await refuse(_key("quiet"), 3)  # an account that stops there
        now[0] += (LOG_EVENTS_DAYS + 1) * 86400
        await refuse(_key("busy"), LOG_EVENTS_KEPT + 30)

    asyncio.run(scenario())
    busy = _events(engine, "busy")
    assert len(busy) == LOG_EVENTS_KEPT
    newest = max(e.created_at for e in busy)
    assert newest - min(e.created_at for e in busy) == timedelta(seconds=2 * (LOG_EVENTS_KEPT - 1))
    assert _events(engine, "quiet") == []  # older than the log keeps anything
    engine.dispose()
