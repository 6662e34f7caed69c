"""A client that hangs up before its answer starts (a client-side timeout, then a retry: what
the `openai` SDK does) is not failing: the server cancels its request (Serve does), the hold is
given back, and the key's error budget (50 failed requests in 30 s) is not spent by it. Before,
such a request counted as a 500, and 51 timeouts in a row locked the key out with 429."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

from serve_app.limits.policy import FAILED_REQUESTS_MAX
from tests.unit.flows.asgi import post_scope

CHAT = "/api/v1/chat/completions"
BODY = {"model": "chat-primary", "messages": [{"role": "user", "content": "Say hi."}]}


def _leave_when(gateway, key: str, waiting: Callable[[], bool], path: str = CHAT,
                body: dict[str, Any] = BODY) -> None:
    """POST `body` to `path` into the gateway's ASGI app as a server would, then cancel it
    once `waiting()`: what Serve's ingress does when the client disconnects."""
    payload = json.dumps(body).encode()
    scope = post_scope(path, payload, {"Authorization": f"Bearer {key}"})

    async def run() -> None:
        asked = False
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            nonlocal asked
            if not asked:
                asked = True
                return {"type": "http.request", "body": payload, "more_body": False}
            await asyncio.Event().wait()  # no disconnect message: the server cancels instead
            raise AssertionError("unreachable")

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        request = asyncio.ensure_future(gateway.client.app(scope, receive, send))
        deadline = asyncio.get_running_loop().time() + 120
        while not waiting() and not request.done():
            assert asyncio.get_running_loop().time() < deadline, "never got to wait"
            await asyncio.sleep(0.002)
        assert not request.done(), f"answered instead of waiting: {sent[:1]}"
        request.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await request
        assert sent == []  # the answer never started

    gateway.client.portal.call(run)


def test_clients_that_hang_up_before_the_answer_do_not_spend_the_error_budget(
        fake_gateway, fakes, key, books):
    fake = fakes["text-xs"]
    before = books.balance_nanos()
    fake.pause()
    try:
        for _ in range(FAILED_REQUESTS_MAX + 5):
            calls = len(fake.calls)
            _leave_when(fake_gateway, key, lambda calls=calls: len(fake.calls) > calls)
    finally:
        fake.resume()

    resp = fake_gateway.client.post("/api/v1/chat/completions", headers=fake_gateway.auth(key),
                                    json=BODY)

    assert resp.status_code == 200, resp.text
    # Nothing delivered to those who left, nothing charged: only this answer is.
    charged = books.only_charge(resp.headers["cf-ray"]).total_nanos
    assert books.balance_nanos() == before - charged
    assert books.open_holds() == 0


def test_a_client_that_hangs_up_while_its_limits_are_decided_gets_its_hold_back(
        fake_gateway, key, books, monkeypatch):
    """The limiter's decision and the hold run side by side (embeddings: nothing to read
    before the hold); the client leaves once the hold
    is taken and before the decision (a slow limiter: the shared actor's round trip). The
    hold is given back at once, not left open until it goes stale an hour later."""
    embed = {"model": "embed-small", "input": "a quick brown fox"}
    # A key with a recent count well inside its limits: its hold runs beside the decision.
    assert fake_gateway.client.post("/api/v1/embeddings", headers=fake_gateway.auth(key),
                                    json=embed).status_code == 200
    backend = fake_gateway.services.limits.backend
    decide = backend.decide

    async def slow_decide(*args, **kwargs):
        if books.open_holds() == 0:  # the request that leaves: decided only after it left
            await asyncio.sleep(3600)
        return await decide(*args, **kwargs)

    monkeypatch.setattr(backend, "decide", slow_decide)
    before = books.balance_nanos()

    _leave_when(fake_gateway, key, lambda: books.open_holds() == 1, "/api/v1/embeddings",
                embed)

    # Given back within moments (a hold still on its way to the database when the client
    # left is released right behind it), not an hour later.
    deadline = time.monotonic() + 120  # well short of the hour a stale hold waits
    while books.open_holds() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert books.open_holds() == 0
    assert books.balance_nanos() == before
