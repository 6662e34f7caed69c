"""The rate-limit headers of a route without a model read the key's shared count once and share
that read: concurrent requests of a key wait for one read, later ones reuse it while it is
fresh, and a decision about the key on this replica makes the next answer read again, so a
client sees its own requests counted."""

from __future__ import annotations

import asyncio

import pytest

from serve_app.accounts.key_store import KeyRecord
from serve_app.db.engine import make_engine
from serve_app.limits.backends import LocalLimiter
from serve_app.limits.policy import WINDOW_MS
from serve_app.limits.rate_limits import RateLimits
from serve_app.limits.shared_counts import PEEK_FRESH_S
from serve_app.models.catalog import load_catalog
from serve_app.settings import PROJECT_ROOT

NOW_S = 1_800_000_000.0


class CountingLimiter(LocalLimiter):
    """The in-process limiter, counting the reads that reach it; `gate` holds them."""

    def __init__(self) -> None:
        super().__init__()
        self.peeks = 0
        self.gate: asyncio.Event | None = None
        self.fail_next = False

    async def peek(self, buckets: list[str], now_ms: int) -> list[int]:
        self.peeks += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_next:
            self.fail_next = False
            raise ConnectionError("the shared count is out of reach")
        return await super().peek(buckets, now_ms)


def _key() -> KeyRecord:
    return KeyRecord(id="key-1", account_id="acct-1", key_hash="h", key_type="INFERENCE",
                     description="", model_privacy="all", limit_period="DAY",
                     limit_usd_nanos=None, limit_diem_nanos=None, expires_at=None)


@pytest.fixture
def setup(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'limits.db'}")
    wall = [NOW_S]
    monotonic = [100.0]
    backend = CountingLimiter()
    limits = RateLimits(backend, engine, clock=lambda: wall[0])
    limits.counts_read.monotonic = lambda: monotonic[0]
    models = load_catalog(PROJECT_ROOT / "configs" / "models.yaml").models
    chat = next(m for m in models if m.type == "text")
    yield limits, backend, models, chat, wall, monotonic
    engine.dispose()


def test_concurrent_answers_share_one_read_and_fresh_reads_are_reused(setup):
    limits, backend, models, _, _, monotonic = setup

    async def scenario() -> None:
        backend.gate = asyncio.Event()
        reads = [asyncio.create_task(limits.current(_key(), models)) for _ in range(8)]
        await asyncio.sleep(0)
        backend.gate.set()
        states = await asyncio.gather(*reads)
        assert backend.peeks == 1
        assert len({s.requests_remaining for s in states}) == 1
        monotonic[0] += PEEK_FRESH_S / 2
        await limits.current(_key(), models)
        assert backend.peeks == 1  # still fresh
        monotonic[0] += PEEK_FRESH_S
        await limits.current(_key(), models)
        assert backend.peeks == 2  # read again once stale

    asyncio.run(scenario())


def test_a_decision_about_the_key_here_is_seen_by_the_next_answer(setup):
    limits, backend, models, chat, _, _ = setup

    async def scenario() -> None:
        before = await limits.current(_key(), models)
        await limits.admit(_key(), chat, 100)
        after = await limits.current(_key(), models)
        assert backend.peeks == 2
        assert after.requests_remaining == before.requests_remaining - 1

    asyncio.run(scenario())


def test_a_read_of_a_window_that_has_ended_is_not_reused(setup):
    limits, backend, models, chat, wall, _ = setup

    async def scenario() -> None:
        await limits.admit(_key(), chat, 100)
        counted = await limits.current(_key(), models)
        wall[0] += WINDOW_MS / 1000  # the window ends; the replica's clock barely moved
        fresh = await limits.current(_key(), models)
        assert backend.peeks == 2
        assert fresh.requests_remaining == counted.requests_remaining + 1

    asyncio.run(scenario())


def test_a_failed_or_slow_read_is_not_kept(setup):
    limits, backend, models, _, _, _ = setup

    async def scenario() -> None:
        backend.fail_next = True
        with pytest.raises(ConnectionError):
            await limits.current(_key(), models)
        assert (await limits.current(_key(), models)) is not None
        assert backend.peeks == 2
        limits.counts_read.forget(_key().id)
        backend.gate = asyncio.Event()  # never set: the read hangs
        with pytest.raises(TimeoutError):
            await limits.current(_key(), models, timeout_s=0.01)
        backend.gate.set()
        assert (await limits.current(_key(), models)) is not None
        assert backend.peeks == 4

    asyncio.run(scenario())
