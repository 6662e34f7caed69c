"""Every money figure a client may set fits the 64-bit nano-unit columns it is kept in: a key's
spending limit at the bound is kept and read back exactly; past it, a 400 naming the field
(the reference's 9,999,999,999 made 9.999e18 nanos, past 2**63 - 1: a 500)."""

from __future__ import annotations

import pytest

from serve_app.money import MAX_AMOUNT_UNITS, to_nanos
from tests.unit.conftest import Gateway


def test_the_largest_amount_fits_a_signed_64_bit_column():
    assert to_nanos(MAX_AMOUNT_UNITS) <= 2**63 - 1


@pytest.mark.parametrize("currency", ["usd", "diem"])
def test_a_spending_limit_at_the_bound_is_kept_and_past_it_is_a_400(gateway: Gateway,
                                                                     currency: str):
    at_bound = gateway.create_key(consumptionLimit={currency: MAX_AMOUNT_UNITS})
    listed = gateway.client.get("/api/v1/api_keys", headers=gateway.auth()).json()["data"]
    mine = next(key for key in listed if key["id"] == at_bound["id"])
    assert mine["consumptionLimits"][currency] == MAX_AMOUNT_UNITS

    for too_much in (MAX_AMOUNT_UNITS + 1, 9_999_999_999):
        resp = gateway.client.post("/api/v1/api_keys", headers=gateway.auth(), json={
            "apiKeyType": "INFERENCE", "description": "d",
            "consumptionLimit": {currency: too_much}})
        assert resp.status_code == 400, resp.text
        assert resp.json()["code"] == "INVALID_REQUEST"
        assert currency in str(resp.json()["details"])
        patched = gateway.client.patch("/api/v1/api_keys", headers=gateway.auth(), json={
            "id": at_bound["id"], "consumptionLimit": {currency: too_much}})
        assert patched.status_code == 400, patched.text


def test_the_admin_cli_refuses_an_amount_past_the_bound(gateway: Gateway, capsys):
    account = gateway.cli("create-account", "--usd", str(MAX_AMOUNT_UNITS))
    listed = next(a for a in gateway.cli("accounts") if a["id"] == account["accountId"])
    assert listed["usd"] == MAX_AMOUNT_UNITS  # kept exactly
    for too_much in (str(MAX_AMOUNT_UNITS + 1), "1e30", "NaN"):
        with pytest.raises(SystemExit):
            gateway.cli("create-account", "--usd", too_much)
        assert "--usd" in capsys.readouterr().err
