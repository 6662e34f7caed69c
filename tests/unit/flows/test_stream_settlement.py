"""One settlement per streamed chat (and /responses stream), however it ends: the charge is in
the ledger when the client reads the stream's last word (`[DONE]`, `response.completed`); a
client gone before the first byte has its hold back and pays nothing; one gone in the middle
pays for what it was sent, nothing held after. The client is an ASGI server's view of one: it
goes away the two ways servers report it (a write that fails, ASGI 2.4; or `http.disconnect`
while a write waits, before 2.4)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from tests.unit.flows.asgi import LeavingClient, post_scope
from tests.unit.flows.sse import DONE, events

BODY = {"model": "chat-primary", "messages": [{"role": "user", "content": "Name a fast fox"}],
        "stream": True}
PATHS = {"chat": ("/api/v1/chat/completions", BODY),
         "responses": ("/api/v1/responses", {"model": "chat-primary", "stream": True,
                                             "input": "Name a fast fox"})}
SERVER_SPECS = ["2.4", "2.3"]


@dataclass
class Read:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: str = ""
    charges_at_end: list | None = None  # the request's charges when the last event came


def _is_last(event: str) -> bool:
    return f"data: {DONE}" in event or "event: response.completed" in event


def _stream(gateway, key: str, books, kind: str, *, leave_after: int | None = None,
            spec: str = "2.4") -> Read:
    """POST a stream into the gateway's ASGI app on its own loop, as a server would. The
    client reads `leave_after` body messages and goes away (0: before the answer starts;
    None: it reads all)."""
    path, body = PATHS[kind]
    payload = json.dumps(body).encode()
    read = Read()

    def saw(body: bytes) -> None:
        text = body.decode()
        read.body += text
        if _is_last(text):
            read.charges_at_end = books.charges(client.headers["cf-ray"])

    client = LeavingClient(payload, leave_after=leave_after, spec=spec, on_body=saw)
    gateway.client.portal.call(client.call, gateway.client.app,
                               post_scope(path, payload, gateway.auth(key), spec=spec))
    read.status, read.headers = client.status, client.headers
    return read


@pytest.mark.parametrize("kind", list(PATHS))
def test_the_charge_is_in_the_ledger_when_the_stream_says_it_is_done(fake_gateway, key,
                                                                     books, kind):
    before = books.balance_nanos()

    read = _stream(fake_gateway, key, books, kind)

    assert read.status == 200
    assert read.charges_at_end is not None, read.body  # the stream's last word came
    (charge,) = read.charges_at_end
    assert charge.lines["input"][0] > 0 and charge.lines["output"][0] > 0
    assert books.only_charge(read.headers["cf-ray"]) == charge  # settled once
    assert books.balance_nanos() == before - charge.total_nanos
    assert books.open_holds() == 0


@pytest.mark.parametrize("spec", SERVER_SPECS)
@pytest.mark.parametrize("kind", list(PATHS))
def test_a_client_gone_before_the_first_byte_gets_its_hold_back(fake_gateway, key, books,
                                                                kind, spec):
    """The answer's start never reaches the client: its body is never sent, and before,
    on an ASGI 2.4 server, its hold stayed open until it went stale an hour later."""
    before = books.balance_nanos()

    read = _stream(fake_gateway, key, books, kind, leave_after=0, spec=spec)

    assert read.status == 200 and read.body == ""
    assert books.charges(read.headers["cf-ray"]) == []
    assert books.open_holds() == 0 and books.balance_nanos() == before


@pytest.mark.parametrize("spec", SERVER_SPECS)
def test_a_client_gone_in_the_middle_pays_for_what_it_was_sent(fake_gateway, fakes, key,
                                                               books, spec):
    before = books.balance_nanos()

    read = _stream(fake_gateway, key, books, "chat", leave_after=1, spec=spec)

    assert read.status == 200
    sent = events(read.body)
    assert sent and DONE not in sent and read.charges_at_end is None
    charge = books.only_charge(read.headers["cf-ray"])
    assert charge.lines["input"][0] > 0  # the prompt the engine read
    assert charge.lines.get("output", (0, 0))[0] <= fakes["text-xs"].completion_tokens()
    assert books.balance_nanos() == before - charge.total_nanos
    assert books.open_holds() == 0
