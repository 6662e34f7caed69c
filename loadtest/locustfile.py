"""Locust scenarios against a running platform (a laptop or a cluster).

    pip install -e ".[loadtest]"
    API_KEY=sk-... locust -f loadtest/locustfile.py --host http://127.0.0.1:8000

Scenarios grow with the API: discovery and key administration now; chat, embeddings and
media as their engines land.
"""

from __future__ import annotations

import os

from locust import HttpUser, between, task

API_KEY = os.environ.get("API_KEY", "")


class DiscoveryUser(HttpUser):
    """Anonymous clients reading the model catalog."""

    wait_time = between(0.05, 0.2)

    @task(5)
    def models(self) -> None:
        self.client.get("/api/v1/models")

    @task(1)
    def traits(self) -> None:
        self.client.get("/api/v1/models/traits")


class AdminUser(HttpUser):
    """An operator's dashboard polling its keys (needs an ADMIN key in API_KEY)."""

    wait_time = between(0.5, 1.0)

    def on_start(self) -> None:
        self.client.headers["Authorization"] = f"Bearer {API_KEY}"

    @task
    def list_keys(self) -> None:
        self.client.get("/api/v1/api_keys")
