"""A background response whose model refuses it for load (503 MODEL_AT_CAPACITY with
`Retry-After`, the fair-share gate's answer) before anything was made stays `queued`, waits
the `Retry-After` (with its jitter) and tries again: it completes once the model takes it,
charged once; a cancel or a delete during the wait ends it at once, nothing charged and the
hold released; past its bound it fails with the refusal, uncharged. Any other failure, and a
resumable chat stream's connected client, get the error at once.

The worker's clock and sleep are the test's (`Waits`): a wait lasts until the test ends it,
and the bound is counted on the test's clock, so nothing here sleeps a `Retry-After`."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest
from openai import OpenAI

from deployments.protocol import at_capacity
from serve_app.responses.capacity_wait import CapacityWait
from tests.fakes import FakeTextDeployment
from tests.fakes.handles import reported

REPLY = "one two three four"
WAIT_S = 60  # a bound for a broken build only: the tests wait on states and events
RETRY_AFTER = 7  # seconds, on the test's clock
JITTER = 0.5  # the jitter drawn: a twentieth of the Retry-After more


class Waits:
    """The worker's clock and sleep: each wait is recorded and advances the clock; it lasts
    until the test lets it end (`go`), unless `instant`."""

    def __init__(self, *, instant: bool = False) -> None:
        self.now, self.seconds = 0.0, []
        self.waiting, self.go = threading.Event(), threading.Event()
        if instant:
            self.go.set()

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.seconds.append(seconds)
        self.now += seconds
        self.waiting.set()
        while not self.go.is_set():  # a cancel ends it here
            await asyncio.sleep(0.01)


@pytest.fixture
def text(fakes) -> FakeTextDeployment:
    fake = fakes["text-xs"]
    for engine in fake.engines.values():
        engine.reply, engine.pieces = REPLY, len(REPLY.split())
    return fake


def _waits(gateway, bound_s: float = 600.0, **kw: Any) -> Waits:
    waits = Waits(**kw)
    gateway.services.responses.capacity_wait = CapacityWait(
        bound_s, clock=waits.clock, sleep=waits.sleep, jitter=lambda: JITTER)
    return waits


def _create(sdk: OpenAI) -> tuple[Any, str]:
    request_id = f"bg-{uuid.uuid4().hex}"
    created = sdk.responses.create(model="chat-primary", input="Count", background=True,
                                   extra_headers={"X-Request-ID": request_id})
    return created, request_id


def _settled(sdk: OpenAI, response_id: str) -> Any:
    """The response once it has ended, read by following its events to their end."""
    for _ in sdk.responses.retrieve(response_id, stream=True):
        pass
    return sdk.responses.retrieve(response_id)


def test_a_response_refused_for_load_stays_queued_and_completes_once_the_model_takes_it(
        fake_gateway, sdk, text, books):
    waits = _waits(fake_gateway)
    text.fail_with(at_capacity("chat-primary", RETRY_AFTER))
    created, request_id = _create(sdk)

    assert waits.waiting.wait(WAIT_S)  # refused once: the worker waits
    assert sdk.responses.retrieve(created.id).status == "queued"
    assert books.held(request_id) is not None  # its hold is kept meanwhile
    assert books.charges(request_id) == []
    text.recover()
    waits.go.set()
    done = _settled(sdk, created.id)

    assert done.status == "completed" and done.output_text == REPLY
    assert waits.seconds == [RETRY_AFTER * (1 + 0.1 * JITTER)]
    assert books.only_charge(request_id).lines["output"][0] == len(REPLY.split())
    assert books.held(request_id) is None


@pytest.mark.parametrize("act", ["cancel", "delete"])
def test_a_cancel_or_delete_while_waiting_ends_it_at_once_with_nothing_charged(
        fake_gateway, sdk, text, books, act):
    waits = _waits(fake_gateway)  # the wait never ends by itself
    text.fail_with(at_capacity("chat-primary", RETRY_AFTER))
    before = books.balance_nanos()
    created, request_id = _create(sdk)
    assert waits.waiting.wait(WAIT_S)

    if act == "cancel":
        assert sdk.responses.cancel(created.id).status == "cancelled"
        assert sdk.responses.retrieve(created.id).status == "cancelled"
    else:
        sdk.responses.delete(created.id)
        assert fake_gateway.client.get(f"/api/v1/responses/{created.id}",
                                       headers={"Authorization": f"Bearer {sdk.api_key}"}
                                       ).status_code == 404

    assert books.charges(request_id) == []
    assert books.held(request_id) is None
    assert books.balance_nanos() == before
    assert len(waits.seconds) == 1  # it never tried again


def test_past_its_bound_it_fails_with_the_refusal_and_nothing_charged(
        fake_gateway, sdk, text, books):
    waits = _waits(fake_gateway, bound_s=10.0, instant=True)
    text.fail_with(at_capacity("chat-primary", RETRY_AFTER))
    before = books.balance_nanos()
    created, request_id = _create(sdk)

    failed = _settled(sdk, created.id)

    assert failed.status == "failed"
    assert failed.error.code == "MODEL_AT_CAPACITY"
    assert failed.error.message == f"Model chat-primary is at capacity; try again in " \
                                   f"{RETRY_AFTER} s"
    # the Retry-After with its jitter, then what was left of the bound; then no more
    assert waits.seconds == pytest.approx([RETRY_AFTER * 1.05, 10.0 - RETRY_AFTER * 1.05])
    assert books.charges(request_id) == []
    assert books.held(request_id) is None
    assert books.balance_nanos() == before


def test_a_failure_that_is_not_for_load_fails_it_at_once(fake_gateway, sdk, text, books):
    waits = _waits(fake_gateway, instant=True)
    text.fail_with(reported(500, "the engine broke"))
    created, request_id = _create(sdk)

    failed = _settled(sdk, created.id)

    assert failed.status == "failed"
    assert waits.seconds == []
    assert books.charges(request_id) == []
    assert books.held(request_id) is None


def test_a_resumable_chat_stream_refused_for_load_is_answered_503_at_once(
        fake_gateway, sdk, text, books):
    waits = _waits(fake_gateway, instant=True)
    text.fail_with(at_capacity("chat-primary", RETRY_AFTER))

    resp = fake_gateway.client.post(
        "/api/v1/chat/completions", headers={"Authorization": f"Bearer {sdk.api_key}"},
        json={"model": "chat-primary", "messages": [{"role": "user", "content": "Count"}],
              "stream": True, "stream_options": {"resumable": True}})

    assert resp.status_code == 503, resp.text
    assert resp.json()["code"] == "MODEL_AT_CAPACITY"
    assert resp.headers["Retry-After"] == str(RETRY_AFTER)
    assert waits.seconds == []
    assert books.open_holds() == 0
