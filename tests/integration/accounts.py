"""A fresh account with its own admin and inference keys, and what it spent: the money side
of the media tests."""

from __future__ import annotations

from decimal import Decimal

import httpx

from serve_app.cli import run as cli
from serve_app.settings import Settings


def nanos(value) -> int:
    return int((Decimal(str(value)) * 10**9).to_integral_value())


class Account:
    """A fresh account with its own admin key and inference key."""

    def __init__(self, platform, tmp_path, usd: str = "5") -> None:
        settings = Settings(data_dir=tmp_path, database_url=platform.sqlite_url)
        created = cli(["create-account", "--usd", usd], settings=settings)
        self.admin, self.account_id = created["apiKey"], created["accountId"]
        self.url = platform.base_url
        self.key = httpx.post(f"{self.url}/api_keys", headers=self._auth(self.admin),
                              json={"apiKeyType": "INFERENCE", "description": "media tests"}
                              ).json()["data"]["apiKey"]
        self.start = self.balance()

    @staticmethod
    def _auth(key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    @property
    def auth(self) -> dict[str, str]:
        return self._auth(self.key)

    def balance(self) -> int:
        body = httpx.get(f"{self.url}/billing/balance", headers=self._auth(self.admin)).json()
        return nanos(body["balances"]["usd"])

    def spent(self) -> int:
        return self.start - self.balance()

    def post(self, path: str, **kwargs) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", headers=self.auth, timeout=300, **kwargs)

    def skus(self) -> list[str]:
        rows = httpx.get(f"{self.url}/billing/usage-history", params={"pageSize": 50},
                         headers=self._auth(self.admin)).json()["data"]
        return sorted(row["sku"] for row in rows)
