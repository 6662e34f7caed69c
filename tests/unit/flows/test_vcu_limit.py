"""A key's `vcu` consumption limit: VCU is DIEM's legacy name, so a key created with only
`{vcu: N}` may spend at most N DIEM in its window, exactly as a key with `{diem: N}`."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from serve_app.settings import Settings
from tests.unit.conftest import Gateway, make_gateway
from tests.unit.flows.conftest import CATALOG

LIMIT = 0.02  # DIEM: a few embedding requests of TEXT
TEXT = "a quick brown fox jumps over the lazy dog " * 20


@pytest.fixture
def diem_gateway(tmp_path: Path, fakes) -> Iterator[Gateway]:
    """An account with no USD and 1 DIEM a day (1 staked token)."""
    for gateway in make_gateway(Settings(data_dir=tmp_path, initial_credit_usd=0,
                                         model_catalog=CATALOG), handles=fakes):
        gateway.cli("stake", "--tokens", "1")
        yield gateway


def _embed(gateway: Gateway, key: str):
    return gateway.client.post("/api/v1/embeddings", headers=gateway.auth(key),
                               json={"model": "embed-small", "input": TEXT})


def _spend_until_refused(gateway: Gateway, key: str) -> tuple[int, object]:
    for admitted in range(100):
        resp = _embed(gateway, key)
        if resp.status_code != 200:
            return admitted, resp
    raise AssertionError("the key was never refused")


def _period_diem(gateway: Gateway, key_id: str) -> Decimal:
    resp = gateway.client.get(f"/api/v1/api_keys/{key_id}", headers=gateway.auth())
    assert resp.status_code == 200, resp.text
    return Decimal(resp.json()["data"]["currentPeriodUsage"]["diem"])


def test_a_vcu_limit_caps_diem_spending_as_a_diem_limit_does(diem_gateway: Gateway) -> None:
    gw = diem_gateway
    admitted = {}
    for name, limit in [("vcu", {"vcu": LIMIT}), ("diem", {"diem": LIMIT}),
                        ("vcu lower", {"vcu": LIMIT, "diem": 1}),
                        ("diem lower", {"diem": LIMIT, "vcu": 1})]:
        created = gw.create_key(consumptionLimit=limit)
        assert created["consumptionLimit"]["vcu"] == limit.get("vcu")
        admitted[name], refused = _spend_until_refused(gw, created["apiKey"])
        assert refused.status_code == 402, refused.text
        assert refused.json()["code"] == "API_KEY_DIEM_SPEND_LIMIT_EXCEEDED"
        assert 0 < _period_diem(gw, created["id"]) <= Decimal(str(LIMIT))
    assert admitted["vcu"] >= 2
    assert set(admitted.values()) == {admitted["vcu"]}, admitted
    # The account still has DIEM: a key without a limit goes on spending it.
    assert _embed(gw, gw.create_key()["apiKey"]).status_code == 200
    balance = gw.client.get("/api/v1/billing/balance", headers=gw.auth()).json()["balances"]
    assert balance["usd"] == 0 and 0 < balance["diem"] < 1


def test_a_vcu_limit_set_later_counts_what_the_key_spent_in_its_window(
        diem_gateway: Gateway) -> None:
    gw = diem_gateway
    created = gw.create_key()
    for _ in range(30):  # more than LIMIT, with no limit yet
        assert _embed(gw, created["apiKey"]).status_code == 200
    resp = gw.client.patch("/api/v1/api_keys", headers=gw.auth(),
                           json={"id": created["id"], "consumptionLimit": {"vcu": LIMIT}})
    assert resp.status_code == 200, resp.text
    assert resp.json()["data"]["consumptionLimits"]["vcu"] == LIMIT
    assert _period_diem(gw, created["id"]) > Decimal(str(LIMIT))
    refused = _embed(gw, created["apiKey"])
    assert refused.status_code == 402, refused.text
    assert refused.json()["code"] == "API_KEY_DIEM_SPEND_LIMIT_EXCEEDED"
