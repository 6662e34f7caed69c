"""Requests left before their answer are bounded (issue 35, item 4): a 499 never counted toward
any budget, so a key could start work, hang up, and start it again without end, each time given
its hold back. Now 499s count toward a budget of their key and one of its account (spread over
many keys); past either, the next request is a 429 before anything is held."""

from __future__ import annotations

import pytest

from serve_app.limits import rate_limits
from tests.unit.flows.test_client_left import BODY, CHAT, _leave_when

PER_KEY, PER_ACCOUNT = 5, 8


@pytest.fixture
def small_budgets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rate_limits, "CLIENT_GONE_MAX", PER_KEY)
    monkeypatch.setattr(rate_limits, "CLIENT_GONE_ACCOUNT_MAX", PER_ACCOUNT)


def _leave(gateway, fake, key: str, times: int) -> None:
    fake.pause()
    try:
        for _ in range(times):
            calls = len(fake.calls)
            _leave_when(gateway, key, lambda calls=calls: len(fake.calls) > calls)
    finally:
        fake.resume()


def _chat(gateway, key: str):
    return gateway.client.post(CHAT, headers=gateway.auth(key), json=BODY)


def test_a_key_that_keeps_hanging_up_is_refused_and_pays_nothing_held(
        small_budgets, fake_gateway, fakes, books):
    fake = fakes["text-xs"]
    leaver, other = (fake_gateway.create_key()["apiKey"] for _ in range(2))
    before = books.balance_nanos()

    _leave(fake_gateway, fake, leaver, PER_KEY + 1)
    calls = len(fake.calls)
    refused = _chat(fake_gateway, leaver)

    assert refused.status_code == 429, refused.text
    assert refused.json()["code"] == "RATE_LIMIT_EXCEEDED"
    assert "closed by the client before the answer" in refused.json()["error"]
    assert "API key" in refused.json()["error"]
    assert len(fake.calls) == calls  # refused before the model was called
    assert books.open_holds() == 0 and books.balance_nanos() == before
    # Another key of the account still has room (the account's budget is not spent yet).
    assert _chat(fake_gateway, other).status_code == 200


def test_hanging_up_spread_over_keys_spends_the_accounts_budget(
        small_budgets, fake_gateway, fakes, books):
    fake = fakes["text-xs"]
    keys = [fake_gateway.create_key()["apiKey"] for _ in range(3)]
    before = books.balance_nanos()

    _leave(fake_gateway, fake, keys[0], PER_KEY - 1)
    _leave(fake_gateway, fake, keys[1], PER_ACCOUNT - PER_KEY + 2)  # the account: 9 > 8
    refused = _chat(fake_gateway, keys[2])  # a key that never left

    assert refused.status_code == 429, refused.text
    assert "requests of this account" in refused.json()["error"]
    assert books.open_holds() == 0 and books.balance_nanos() == before
