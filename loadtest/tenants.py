"""The two-tenant mix of `make loadtest` (`LOADTEST_ARGS="--mix tenants"`): one heavy account
keeps long streams open without a pause (`LOADTEST_HEAVY_USERS` of the users, 24 unless set),
and every other user is a light account's client sending short streamed chats now and then.
What it shows: the light tenant's time to first token (p50, p95) while the heavy one floods,
and how many of either were told 503 to come back later (the answers by status, per route).
Both accounts' ledgers are reconciled after the run.
"""

from __future__ import annotations

import itertools
import json
import os
import time

from locust import HttpUser, between, constant, task
from locustfile import KEYS, MODELS, _metric, _sentence, record

_light_keys = itertools.cycle(KEYS["inference"])


def _stream(user: HttpUser, route: str, max_tokens: int, payer: str | None) -> float | None:
    """One streamed chat; its time to first token in ms (None: not started). A 503 waits its
    `Retry-After` before the user's next request, as a client that honours it would."""
    body = {"model": MODELS["chat"], "stream": True, "max_tokens": max_tokens,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": f"Write about {_sentence(6)}."}]}
    started = time.perf_counter()
    first = None
    usage: dict = {}
    with user.client.post("/api/v1/chat/completions", json=body, stream=True,
                          name=f"POST /chat/completions ({route})", catch_response=True,
                          timeout=300) as resp:
        if resp.status_code != 200:
            record(resp, route, payer=payer)
            if resp.status_code == 503:
                resp.success()  # an honest answer, counted by status in the report
                time.sleep(float(resp.headers.get("Retry-After", "1")))
            else:
                resp.failure(f"HTTP {resp.status_code}")
            return None
        record(resp, route, payer=payer)
        for line in resp.iter_lines():
            if not line or not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
                first = first or time.perf_counter()
        record(resp, route, usage, payer=payer)
    return None if first is None else (first - started) * 1000


class HeavyTenantUser(HttpUser):
    """The heavy account: 128-token streams, one after another."""

    fixed_count = int(os.environ.get("LOADTEST_HEAVY_USERS", "24"))
    wait_time = constant(0)

    def on_start(self) -> None:
        self.client.headers["Authorization"] = f"Bearer {KEYS['heavy']}"

    @task
    def flood(self) -> None:
        _stream(self, "chat-heavy", 128, "heavy")


class LightTenantUser(HttpUser):
    """The light account's clients: a short streamed chat every few seconds."""

    wait_time = between(1.0, 3.0)

    def on_start(self) -> None:
        self.client.headers["Authorization"] = f"Bearer {next(_light_keys)}"

    @task
    def chat(self) -> None:
        first = _stream(self, "chat-light", 16, None)
        if first is not None:
            _metric("light tenant time to first token (ms)", first)
