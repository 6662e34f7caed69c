"""Background responses as the `openai` SDK uses them: `background: true` answers at once and
the generation runs on without any client; its numbered events are kept, so a stream cut after
event k resumes after k (`starting_after`, or SSE's `Last-Event-ID`) with every later event
once, through any Gateway replica; a resumable chat stream likewise; a cancel stops the engine
and charges what it made; only the owning account sees it; a
finished response and its events expire, and an account keeps a bounded number."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

import openai
import pytest
from openai import OpenAI
from sqlmodel import Session

from serve_app.billing import ledger
from serve_app.db.engine import make_engine
from serve_app.db.tables import StoredResponse, utcnow
from serve_app.responses.events import RedisEventLog
from tests.fakes import FakeTextDeployment
from tests.unit.conftest import account_key, make_gateway, sdk_of

REPLY = "one two three four five six seven eight"
WAIT_S = 60  # a bound for a broken build only: the tests wait on states and events


@pytest.fixture
def text(fakes) -> FakeTextDeployment:
    fake = fakes["text-xs"]
    for engine in fake.engines.values():
        engine.reply, engine.pieces = REPLY, len(REPLY.split())  # a word a piece
    return fake


class Gate:
    """The engine stops after `after` pieces until the generation is cancelled; `reached`
    tells the test it is there, `closed` that the engine's generator was stopped."""

    def __init__(self, fake: FakeTextDeployment, after: int,
                 until: threading.Event | None = None) -> None:
        self.reached, self.closed, self.after = threading.Event(), threading.Event(), after
        self.until = until  # set: the engine goes on (None: only a cancel ends the wait)
        self.sent_after_gate = 0
        for engine in fake.engines.values():
            engine.generate = self._generate(engine)  # type: ignore[method-assign]

    def _generate(self, engine):
        async def generate(request) -> AsyncIterator[Any]:
            try:
                for index, event in enumerate(engine.chunks(request)):
                    if index == self.after:
                        self.reached.set()
                        if self.until is None:
                            await asyncio.Event().wait()  # until cancelled
                        else:
                            await asyncio.to_thread(self.until.wait, WAIT_S)
                        self.sent_after_gate += self.until is None
                    yield event
            finally:
                self.closed.set()
        return generate


def _settled(sdk: OpenAI, response_id: str) -> Any:
    """The response once it has ended, read by following its events to their end."""
    for _ in sdk.responses.retrieve(response_id, stream=True):
        pass
    return sdk.responses.retrieve(response_id)


def _create(sdk: OpenAI) -> tuple[Any, str]:
    """A background response, and the request id its hold is kept under (the client's)."""
    request_id = f"bg-{uuid.uuid4().hex}"
    created = sdk.responses.create(model="chat-primary", input="Count", background=True,
                                   extra_headers={"X-Request-ID": request_id})
    return created, request_id


def test_a_background_response_completes_with_no_client_and_is_fetched_later(
        fake_gateway, sdk, text, books):
    created, request_id = _create(sdk)
    assert created.status == "queued" and created.background is True

    # nobody reads it: the generation settles by itself
    charge = _wait_for(lambda: books.charges(request_id))[0]
    done = _wait_for(lambda: (r := sdk.responses.retrieve(created.id)).status == "completed"
                     and r)

    assert done.output_text == REPLY
    assert done.usage.output_tokens == len(REPLY.split())
    assert charge.lines["output"][0] == len(REPLY.split())
    assert books.held(request_id) is None


def test_a_stream_cut_after_event_k_resumes_with_every_later_event_once(fake_gateway, sdk, key,
                                                                        text):
    uncut = [e for e in sdk.responses.create(model="chat-primary", input="Count",
                                             stream=True)]
    k = 4
    seen: list[dict[str, Any]] = []
    with fake_gateway.client.stream("POST", "/api/v1/responses", headers=fake_gateway.auth(key),
                                    json={"model": "chat-primary", "input": "Count",
                                          "background": True, "stream": True}) as cut:
        for line in cut.iter_lines():
            if line.startswith("data: "):
                seen.append(json.loads(line[6:]))
                if seen[-1]["sequence_number"] == k:
                    break  # the connection drops here
    response_id = seen[0]["response"]["id"]

    resumed = list(sdk.responses.retrieve(response_id, stream=True, starting_after=k))

    numbers = [e["sequence_number"] for e in seen] + [e.sequence_number for e in resumed]
    assert numbers == list(range(len(numbers)))  # each once, none missing
    assert [e.type for e in resumed][-1] == "response.completed"
    deltas = [e["delta"] for e in seen if e["type"] == "response.output_text.delta"] + [
        e.delta for e in resumed if e.type == "response.output_text.delta"]
    uncut_text = "".join(e.delta for e in uncut if e.type == "response.output_text.delta")
    assert "".join(deltas) == uncut_text == REPLY
    assert [e["type"] for e in seen] + [e.type for e in resumed] == [e.type for e in uncut]


def test_a_stream_resumes_after_the_last_event_id_it_received(fake_gateway, sdk, key, text):
    created = sdk.responses.create(model="chat-primary", input="Count", background=True)
    everything = list(sdk.responses.retrieve(created.id, stream=True))

    resp = fake_gateway.client.get(f"/api/v1/responses/{created.id}?stream=true",
                                   headers={**fake_gateway.auth(key), "Last-Event-ID": "2"})

    assert resp.status_code == 200, resp.text
    ids = [int(line[4:]) for line in resp.text.splitlines() if line.startswith("id: ")]
    assert ids == [e.sequence_number for e in everything][3:]


def test_a_cancel_stops_the_engine_and_charges_what_it_made(fake_gateway, sdk, text, books):
    gate = Gate(text, after=3)  # three pieces, each a word
    before = books.balance_nanos()
    created, request_id = _create(sdk)
    assert gate.reached.wait(WAIT_S)
    _wait_for(lambda: _text_kept(fake_gateway, created.id) == "one two three ")

    cancelled = sdk.responses.cancel(created.id)

    assert cancelled.status == "cancelled"
    assert gate.closed.is_set() and gate.sent_after_gate == 0  # the engine was stopped
    assert cancelled.output[0].content[0].text == "one two three "
    charge = books.only_charge(request_id)
    assert charge.lines["output"][0] == 3
    assert books.held(request_id) is None  # the rest of the hold released
    assert books.balance_nanos() == before - charge.total_nanos
    assert sdk.responses.retrieve(created.id).status == "cancelled"
    assert sdk.responses.cancel(created.id).status == "cancelled"  # once is enough


def test_another_account_cannot_see_or_touch_a_response(fake_gateway, sdk, text):
    created = sdk.responses.create(model="chat-primary", input="Count", background=True)
    _settled(sdk, created.id)
    stranger = sdk_of(fake_gateway, account_key(fake_gateway, "5")[0])

    for act in (lambda: stranger.responses.retrieve(created.id),
                lambda: stranger.responses.retrieve(created.id, stream=True),
                lambda: stranger.responses.cancel(created.id),
                lambda: stranger.responses.delete(created.id)):
        with pytest.raises(openai.NotFoundError) as refused:
            act()
        assert refused.value.response.json()["code"] == "MEDIA_NOT_FOUND"
    assert sdk.responses.retrieve(created.id).status == "completed"


def test_a_deleted_response_is_gone_with_its_events(fake_gateway, sdk, text):
    created = sdk.responses.create(model="chat-primary", input="Count", background=True)
    _settled(sdk, created.id)

    sdk.responses.delete(created.id)

    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(created.id)
    events = fake_gateway.client.portal.call(
        fake_gateway.services.responses.events.read, created.id, -1)
    assert events == []


def test_a_finished_response_and_its_events_expire(fake_gateway, sdk, text):
    created = sdk.responses.create(model="chat-primary", input="Count", background=True)
    _settled(sdk, created.id)
    responses = fake_gateway.services.responses
    responses.store.clock = lambda: utcnow() + responses.kept + timedelta(seconds=1)

    fake_gateway.client.portal.call(responses.sweep)

    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(created.id)
    assert fake_gateway.client.portal.call(responses.events.read, created.id, -1) == []


def test_the_account_bound_refuses_new_background_work_and_holds_nothing(
        fake_gateway, sdk, text, books):
    fake_gateway.services.responses.per_account = 1
    kept = sdk.responses.create(model="chat-primary", input="Count", background=True)
    _settled(sdk, kept.id)
    before = books.balance_nanos()

    with pytest.raises(openai.RateLimitError) as refused:
        sdk.responses.create(model="chat-primary", input="Count", background=True)

    body = refused.value.response.json()
    assert body["code"] == "RATE_LIMIT_EXCEEDED" and "DELETE /responses" in body["error"]
    assert books.balance_nanos() == before and books.open_holds() == 0
    sdk.responses.delete(kept.id)  # room again
    assert sdk.responses.create(model="chat-primary", input="Count",
                                background=True).status == "queued"


def test_an_account_follows_a_bounded_number_of_streams_at_once(fake_gateway, sdk, key, text):
    responses = fake_gateway.services.responses
    responses.followers_per_account = 1
    gate = Gate(text, after=3, until=threading.Event())
    created = sdk.responses.create(model="chat-primary", input="Count", background=True)
    assert gate.reached.wait(WAIT_S)
    followed: list[Any] = []
    follower = threading.Thread(target=lambda: followed.extend(
        sdk.responses.retrieve(created.id, stream=True)))
    try:
        follower.start()
        _wait_for(lambda: sum(responses._followers.values()) == 1)  # it follows, live

        refused = fake_gateway.client.get(f"/api/v1/responses/{created.id}?stream=true",
                                          headers=fake_gateway.auth(key))
        assert refused.status_code == 429, refused.text
        assert refused.json()["code"] == "RATE_LIMIT_EXCEEDED"
        assert int(refused.headers["Retry-After"]) >= 1
        assert sdk.responses.retrieve(created.id).status == "in_progress"  # polling still works
    finally:
        gate.until.set()
        follower.join(WAIT_S)

    assert followed[-1].type == "response.completed"
    assert responses._followers == {}  # the stream ended: its place is free again
    again = list(sdk.responses.retrieve(created.id, stream=True, starting_after=0))
    assert again[-1].type == "response.completed"


def test_a_response_whose_replica_died_and_that_cannot_be_continued_is_failed_by_the_sweep(
        fake_gateway, sdk, text):
    gate = Gate(text, after=3)
    created = sdk.responses.create(model="chat-primary", input="Count", background=True)
    assert gate.reached.wait(WAIT_S)
    _wait_for(lambda: _text_kept(fake_gateway, created.id) == "one two three ")
    responses = fake_gateway.services.responses
    drive = responses._drives.pop(created.id)  # its replica is gone: its lease runs out
    with Session(make_engine(fake_gateway.settings.resolved_database_url)) as session:
        row = session.get(StoredResponse, created.id)
        row.lease_owner, row.lease_expires_at = "gone", utcnow() - timedelta(seconds=1)
        row.continuation = None  # as one with tools or a schema keeps (test_response_takeover)
        session.add(row)
        session.commit()

    fake_gateway.client.portal.call(responses.sweep)

    failed = sdk.responses.retrieve(created.id)
    assert failed.status == "failed" and failed.error.code == "INFERENCE_FAILED"
    events = list(sdk.responses.retrieve(created.id, stream=True))
    assert events[-1].type == "response.failed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    fake_gateway.client.portal.call(_stop, drive.task)  # what the dead replica left running


@pytest.mark.parametrize("hold_released", [False, True], ids=["held", "hold-released"])
def test_a_live_worker_that_lost_its_lease_appends_nothing_after_the_sweeps_end(
        fake_gateway, sdk, text, books, hold_released):
    gate = Gate(text, after=3, until=threading.Event())
    before = books.balance_nanos()
    created, request_id = _create(sdk)
    assert gate.reached.wait(WAIT_S)
    _wait_for(lambda: _text_kept(fake_gateway, created.id) == "one two three ")
    responses = fake_gateway.services.responses
    drive = responses._drives[created.id]
    with Session(make_engine(fake_gateway.settings.resolved_database_url)) as session:
        row = session.get(StoredResponse, created.id)  # its renewal is late: the lease ran out
        row.lease_expires_at = utcnow() - timedelta(seconds=1)
        row.continuation = None  # it cannot be continued (test_response_takeover: one that can)
        session.add(row)
        session.commit()
    replica = make_gateway(fake_gateway.settings)  # another replica's sweep fails it
    try:
        other = next(replica)
        other.client.portal.call(other.services.responses.sweep)
    finally:
        replica.close()
    if hold_released:  # and the billing sweep gave its hold back (ledger.release, as it does)
        billing = fake_gateway.services.billing
        assert fake_gateway.client.portal.call(
            billing.writer.run, lambda s: ledger.release(s, request_id)) is not None

    gate.until.set()  # the worker goes on, unaware until its next append
    fake_gateway.client.portal.call(_wait_task, drive.task)

    events = list(sdk.responses.retrieve(created.id, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events].count("response.failed") == 1
    assert events[-1].type == "response.failed"  # the sweep's end stays the last event
    failed = sdk.responses.retrieve(created.id)
    assert failed.status == "failed" and failed.error.code == "INFERENCE_FAILED"
    assert gate.closed.is_set()  # the engine was stopped
    assert books.held(request_id) is None
    charges = books.charges(request_id)
    if hold_released:  # never charged after the release
        assert charges == [] and books.balance_nanos() == before
    else:  # what the engine made, charged once
        assert len(charges) == 1 and charges[0].lines["output"][0] >= 3
        assert books.balance_nanos() == before - charges[0].total_nanos


def test_a_worker_whose_engine_is_silent_finds_its_lost_lease_at_its_renewal(
        fake_gateway, sdk, text, books):
    responses = fake_gateway.services.responses
    responses.store.lease = timedelta(seconds=0.3)  # renewed every 0.1 s
    gate = Gate(text, after=3)  # the engine then sends nothing until it is stopped
    created, request_id = _create(sdk)
    assert gate.reached.wait(WAIT_S)
    _wait_for(lambda: _text_kept(fake_gateway, created.id) == "one two three ")
    drive = responses._drives[created.id]
    with Session(make_engine(fake_gateway.settings.resolved_database_url)) as session:
        row = session.get(StoredResponse, created.id)  # taken for dead: no longer its own
        row.lease_owner, row.lease_expires_at = "gone", utcnow() - timedelta(seconds=1)
        row.continuation = None  # it cannot be continued: the sweep fails it
        session.add(row)
        session.commit()
    replica = make_gateway(fake_gateway.settings)
    try:
        other = next(replica)
        other.client.portal.call(other.services.responses.sweep)
    finally:
        replica.close()

    fake_gateway.client.portal.call(_wait_task, drive.task)  # its renewal stopped it

    assert gate.closed.is_set() and gate.sent_after_gate == 0
    events = list(sdk.responses.retrieve(created.id, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events].count("response.failed") == 1
    assert events[-1].type == "response.failed"
    # settled once the response has ended (it may have seen it still open, as another's)
    _wait_for(lambda: books.charges(request_id))
    assert books.only_charge(request_id).lines["output"][0] == 3  # what it made, once
    assert books.held(request_id) is None


async def _wait_task(task: asyncio.Task) -> None:
    await asyncio.wait([task])


async def _stop(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.wait([task])


def test_a_stream_started_through_one_replica_resumes_live_through_another(
        fake_gateway, sdk, key, text):
    gate = Gate(text, after=3, until=threading.Event())
    created = sdk.responses.create(model="chat-primary", input="Count", background=True)
    assert gate.reached.wait(WAIT_S)
    _wait_for(lambda: _text_kept(fake_gateway, created.id) == "one two three ")
    k = max(seq for seq, _ in fake_gateway.client.portal.call(
        fake_gateway.services.responses.events.read, created.id, -1))
    # a second Gateway replica: its own services and event loop, the same database
    replica = make_gateway(fake_gateway.settings)
    other = next(replica)
    resumed: list[Any] = []
    reader = threading.Thread(target=lambda: resumed.extend(sdk_of(other, key).responses.retrieve(
        created.id, stream=True, starting_after=k)))
    try:
        reader.start()
        gate.until.set()  # the generation goes on while the other replica's client waits
        reader.join(WAIT_S)
    finally:
        gate.until.set()
        replica.close()

    assert not reader.is_alive()
    assert [e.sequence_number for e in resumed] == list(range(k + 1, k + 1 + len(resumed)))
    assert resumed[-1].type == "response.completed"
    assert "one two three " + "".join(
        e.delta for e in resumed if e.type == "response.output_text.delta") == REPLY
    assert other.services.responses._drives == {}  # it only read


def test_a_replica_shutting_down_fails_the_responses_it_cannot_hand_over_charging_what_they_made(
        fake_gateway, sdk, text, books):
    gate = Gate(text, after=3)
    created, request_id = _create(sdk)
    assert gate.reached.wait(WAIT_S)
    _wait_for(lambda: _text_kept(fake_gateway, created.id) == "one two three ")
    with Session(make_engine(fake_gateway.settings.resolved_database_url)) as session:
        row = session.get(StoredResponse, created.id)
        row.continuation = None  # as one with tools or a schema keeps (test_response_takeover)
        session.add(row)
        session.commit()

    fake_gateway.client.portal.call(fake_gateway.services.responses.stop)

    stopped = sdk.responses.retrieve(created.id)
    assert stopped.status == "failed" and "shut down" in stopped.error.message
    assert gate.closed.is_set()
    assert books.only_charge(request_id).lines["output"][0] == 3
    assert books.held(request_id) is None
    events = list(sdk.responses.retrieve(created.id, stream=True))
    assert events[-1].type == "response.failed"


def test_the_sdk_stream_helper_resumes_a_response(sdk, text):
    created = sdk.responses.create(model="chat-primary", input="Count", background=True)
    _settled(sdk, created.id)

    with sdk.responses.stream(response_id=created.id, starting_after=2) as stream:
        resumed = list(stream)
        final = stream.get_final_response()

    assert resumed[0].sequence_number == 3 and resumed[-1].type == "response.completed"
    assert final.output_text == REPLY


def test_a_resume_from_a_number_that_is_no_event_is_refused(fake_gateway, sdk, key, text):
    created = sdk.responses.create(model="chat-primary", input="Count", background=True)
    url = f"/api/v1/responses/{created.id}?stream=true"

    for query, headers in (("&starting_after=-2", {}), ("", {"Last-Event-ID": "seven"}),
                           ("", {"Last-Event-ID": "-3"})):
        resp = fake_gateway.client.get(url + query,
                                       headers={**fake_gateway.auth(key), **headers})
        assert resp.status_code == 400, resp.text
        assert resp.json()["code"] == "INVALID_REQUEST"


def test_many_responses_cut_resumed_cancelled_or_left_are_each_charged_once(
        fake_gateway, sdk, text, books):
    before = books.balance_nanos()
    started = [_create(sdk) for _ in range(12)]
    for index, (created, _) in enumerate(started):
        if index % 3 == 0:
            sdk.responses.cancel(created.id)  # mid-way, or once it ended (then nothing)
        elif index % 3 == 1:
            kept = list(sdk.responses.retrieve(created.id, stream=True))
            k = index % len(kept)
            again = list(sdk.responses.retrieve(created.id, stream=True, starting_after=k))
            assert [e.sequence_number for e in again] == [e.sequence_number
                                                          for e in kept][k + 1:]
        # the others are never read
    ended = [_settled(sdk, created.id) for created, _ in started]

    assert all(r.status in ("completed", "cancelled") for r in ended)
    charged = 0
    for (_, request_id), response in zip(started, ended, strict=True):
        charges = books.charges(request_id)
        assert len(charges) <= 1 and books.held(request_id) is None
        if response.status == "completed":
            assert charges[0].lines["output"][0] == len(REPLY.split())
        charged += sum(c.total_nanos for c in charges)
    assert books.open_holds() == 0
    assert books.balance_nanos() == before - charged


def test_background_with_store_false_is_refused(sdk):
    with pytest.raises(openai.BadRequestError):
        sdk.responses.create(model="chat-primary", input="Count", background=True,
                             store=False)


def _text_kept(gateway, response_id: str) -> str:
    """The text of the deltas kept so far (the deployment may merge pieces into one)."""
    kept = gateway.client.portal.call(gateway.services.responses.events.read, response_id, -1)
    events = [json.loads(data) for _, data in kept]
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


def _wait_for(check):
    """`check()` once it is truthy: the state the test waits on (read again as it changes)."""
    for _ in _beats():
        found = check()
        if found:
            return found
    raise AssertionError("never reached")


def _beats() -> Iterator[None]:
    stop = threading.Event()
    for _ in range(WAIT_S * 100):
        yield
        stop.wait(0.01)


def _sse(body: str) -> list[tuple[int, str]]:
    """A stream's events: (SSE id, data)."""
    events, seq = [], None
    for line in body.splitlines():
        if line.startswith("id: "):
            seq = int(line[4:])
        elif line.startswith("data: "):
            assert seq is not None, "every kept event is numbered"
            events.append((seq, line[6:]))
    return events


def _content(events: list[tuple[int, str]]) -> str:
    chunks = [json.loads(data) for _, data in events if data != "[DONE]"]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                   if c.get("choices"))


def test_a_resumable_chat_stream_resumes_after_its_last_event_id(fake_gateway, key, text,
                                                                 books):
    chat = {"model": "chat-primary", "messages": [{"role": "user", "content": "Count"}],
            "stream": True}
    uncut = fake_gateway.client.post("/api/v1/chat/completions", json=chat,
                                     headers=fake_gateway.auth(key))
    request_id = f"chat-{uuid.uuid4().hex}"
    first = fake_gateway.client.post(
        "/api/v1/chat/completions", json={**chat, "stream_options": {"resumable": True}},
        headers={**fake_gateway.auth(key), "X-Request-ID": request_id})
    assert first.status_code == 200, first.text
    events = _sse(first.text)
    stream_id = json.loads(events[0][1])["id"]
    assert stream_id.startswith("chatcmpl-")
    assert [seq for seq, _ in events] == list(range(len(events)))
    assert events[-1][1] == "[DONE]"
    k = 1  # the client kept events 0 and 1, then its connection dropped

    resumed = fake_gateway.client.get(
        f"/api/v1/chat/completions/{stream_id}?stream=true",
        headers={**fake_gateway.auth(key), "Last-Event-ID": str(k)})

    assert resumed.status_code == 200, resumed.text
    later = _sse(resumed.text)
    assert later == events[k + 1:]  # each later event once, the same as first sent
    assert _content(events[:k + 1] + later) == _content(
        [(0, line[6:]) for line in uncut.text.splitlines() if line.startswith("data: ")])
    assert _content(events) == REPLY
    assert books.only_charge(request_id).lines["output"][0] == len(REPLY.split())
    stranger = account_key(fake_gateway, "5")[0]
    assert fake_gateway.client.get(f"/api/v1/chat/completions/{stream_id}?stream=true",
                                   headers=fake_gateway.auth(stranger)).status_code == 404
    assert fake_gateway.client.get(f"/api/v1/responses/{stream_id}",
                                   headers=fake_gateway.auth(key)).status_code == 404


def test_a_resumable_chat_stream_is_deleted_with_its_engine_stopped_and_what_it_made_charged(
        fake_gateway, key, text, books):
    gate = Gate(text, after=3)
    request_id = f"chat-{uuid.uuid4().hex}"
    answered: list[Any] = []
    chat = {"model": "chat-primary", "messages": [{"role": "user", "content": "Count"}],
            "stream": True, "stream_options": {"resumable": True}}
    client = threading.Thread(target=lambda: answered.append(fake_gateway.client.post(
        "/api/v1/chat/completions", json=chat,
        headers={**fake_gateway.auth(key), "X-Request-ID": request_id})))
    client.start()
    assert gate.reached.wait(WAIT_S)
    responses = fake_gateway.services.responses
    stream_id = _wait_for(lambda: next(iter(responses._drives), None))
    account_id = fake_gateway.client.portal.call(responses.store.get, stream_id).account_id
    stranger = account_key(fake_gateway, "5")[0]
    assert fake_gateway.client.delete(f"/api/v1/chat/completions/{stream_id}",
                                      headers=fake_gateway.auth(stranger)).status_code == 404
    assert fake_gateway.client.delete(f"/api/v1/responses/{stream_id}",
                                      headers=fake_gateway.auth(key)).status_code == 404

    deleted = fake_gateway.client.delete(f"/api/v1/chat/completions/{stream_id}",
                                         headers=fake_gateway.auth(key))

    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {"id": stream_id, "object": "chat.completion.deleted",
                              "deleted": True}
    assert gate.closed.is_set() and gate.sent_after_gate == 0  # the engine was stopped
    client.join(WAIT_S)
    assert answered and answered[0].status_code == 200  # its client's stream ended
    assert books.only_charge(request_id).lines["output"][0] == 3
    assert books.held(request_id) is None
    assert fake_gateway.client.get(f"/api/v1/chat/completions/{stream_id}",
                                   headers=fake_gateway.auth(key)).status_code == 404
    assert fake_gateway.client.portal.call(responses.store.usage, account_id) == (0, 0)


def test_with_redis_the_events_are_kept_there_and_resumed(redis_gateway, text):
    sdk = sdk_of(redis_gateway, redis_gateway.create_key()["apiKey"])
    created = sdk.responses.create(model="chat-primary", input="Count", background=True)
    everything = list(sdk.responses.retrieve(created.id, stream=True))
    responses = redis_gateway.services.responses
    assert isinstance(responses.events, RedisEventLog)
    k = 2

    resumed = list(sdk.responses.retrieve(created.id, stream=True, starting_after=k))

    assert [e.sequence_number for e in resumed] == [e.sequence_number
                                                    for e in everything][k + 1:]
    assert "".join(e.delta for e in everything
                   if e.type == "response.output_text.delta") == REPLY
    sdk.responses.delete(created.id)
    assert redis_gateway.client.portal.call(responses.events.read, created.id, -1) == []
