"""A background response whose Gateway replica died is continued by another replica: its
sweep claims the lease (one replica of those sweeping at once), the engine continues the text
kept so far, and a client resuming through the other replica receives every later event once,
to `response.completed`, with the text of an uncut run; the hold the dead replica took is
settled once for all that was made. A response whose cancel was asked is not continued (it
ends cancelled, charged for what was made); one whose hold is gone is failed, uncharged.

The dying replica is the test's own Gateway with the response's task taken away from it (it
goes on waiting in the engine, as a process that stopped would leave nothing to act), its
lease run out; the second is another Gateway on the same database and model deployments."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlmodel import Session

from serve_app.billing import ledger
from serve_app.db.engine import make_engine
from serve_app.db.tables import StoredResponse, utcnow
from serve_app.responses.drive import Drive
from tests.fakes import FakeTextDeployment
from tests.unit.conftest import make_gateway, sdk_of
from tests.unit.flows.books import Books
from tests.unit.flows.test_background_responses import (
    REPLY,
    WAIT_S,
    _create,
    _text_kept,
    _wait_for,
)

WORDS = len(REPLY.split())


@pytest.fixture
def text(fakes) -> FakeTextDeployment:
    fake = fakes["text-xs"]
    for engine in fake.engines.values():
        engine.reply, engine.pieces = REPLY, WORDS  # a word a piece
    return fake


class FirstCallCut:
    """The engine's first generation stops after `after` pieces and waits (until cancelled,
    or `until` is set); the later ones (the continuation) run as usual. The requests each
    call was sent are kept."""

    def __init__(self, fake: FakeTextDeployment, after: int,
                 until: threading.Event | None = None) -> None:
        self.reached, self.closed, self.after, self.until = (
            threading.Event(), threading.Event(), after, until)
        self.requests: list[Any] = []
        for engine in fake.engines.values():
            engine.generate = self._generate(engine, engine.generate)  # type: ignore[method-assign]

    def _generate(self, engine, generate):
        async def cut(request) -> AsyncIterator[Any]:
            first = not self.requests
            self.requests.append(request)
            if not first:
                async for event in generate(request):
                    yield event
                return
            try:
                for index, event in enumerate(engine.chunks(request)):
                    if index == self.after:
                        self.reached.set()
                        if self.until is None:
                            await asyncio.Event().wait()  # a replica that is gone
                        else:
                            await asyncio.to_thread(self.until.wait, WAIT_S)
                    yield event
            finally:
                self.closed.set()
        return cut


def _last_seq(gateway, response_id: str) -> int:
    kept = gateway.client.portal.call(gateway.services.responses.events.read, response_id, -1)
    return max(seq for seq, _ in kept)


def _lease_runs_out(gateway, response_id: str) -> None:
    with Session(make_engine(gateway.settings.resolved_database_url)) as session:
        row = session.get(StoredResponse, response_id)
        row.lease_expires_at = utcnow() - timedelta(seconds=1)
        session.add(row)
        session.commit()


def _dies(gateway, response_id: str) -> Drive:
    """The response's replica stops: its worker does nothing more, its lease runs out. Its
    drive (its task still waiting in the engine), for `_bury` once the test is done."""
    drive = gateway.services.responses._drives.pop(response_id)
    _lease_runs_out(gateway, response_id)
    return drive


def _bury(gateway, response_id: str, drive: Drive) -> None:
    """Stop what the dead replica left waiting, as a worker that lost its lease stops: it
    writes nothing, and its bill charges nothing once the hold is gone (a process that
    died would not even do that)."""
    drive.lost = True
    gateway.services.responses._drives[response_id] = drive
    gateway.client.portal.call(_stop, drive.task)
    _wait_for(lambda: gateway.services.responses.drives._leaving == set())


@contextlib.contextmanager
def _replica(gateway, fakes) -> Iterator[Any]:
    """Another Gateway replica: its own services and event loop, the same database and
    model deployments."""
    replica = make_gateway(gateway.settings, handles=fakes)
    try:
        yield next(replica)
    finally:
        replica.close()


async def _stop(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.wait([task])


def _charged_prompt(charge) -> int:
    return sum(charge.lines.get(line, (0, 0))[0] for line in ("input", "cache_read"))


def test_a_response_whose_replica_died_is_continued_and_resumed_through_another(
        fake_gateway, fakes, sdk, key, text, books):
    uncut = sdk.responses.create(model="chat-primary", input="Count", background=True)
    for _ in sdk.responses.retrieve(uncut.id, stream=True):
        pass
    uncut = sdk.responses.retrieve(uncut.id)
    cut = FirstCallCut(text, after=3)
    before = books.balance_nanos()
    created, request_id = _create(sdk)
    assert cut.reached.wait(WAIT_S)
    _wait_for(lambda: _text_kept(fake_gateway, created.id) == "one two three ")
    k = _last_seq(fake_gateway, created.id)
    dead = _dies(fake_gateway, created.id)

    with _replica(fake_gateway, fakes) as other:
        other.client.portal.call(other.services.responses.sweep)
        client = sdk_of(other, key)
        resumed = list(client.responses.retrieve(created.id, stream=True, starting_after=k))
        whole = list(client.responses.retrieve(created.id, stream=True))
        done = client.responses.retrieve(created.id)
    _bury(fake_gateway, created.id, dead)

    assert [e.sequence_number for e in resumed] == list(range(k + 1, k + 1 + len(resumed)))
    assert resumed[-1].type == "response.completed"
    assert [e.sequence_number for e in whole] == list(range(len(whole)))
    assert "".join(e.delta for e in whole if e.type == "response.output_text.delta") == REPLY
    assert [e.type for e in whole].count("response.output_item.added") == 1  # one message
    assert done.status == "completed" and done.output_text == uncut.output_text == REPLY
    assert done.usage.output_tokens == uncut.usage.output_tokens == WORDS
    assert done.usage.input_tokens == uncut.usage.input_tokens
    continued = cut.requests[1]  # the text kept so far, continued
    assert continued.messages[-1] == {"role": "assistant", "content": "one two three "}
    assert continued.chat_template_kwargs["continue_final_message"] is True
    assert len(cut.requests) == 2
    charge = books.only_charge(request_id)  # once, for all that was made
    assert charge.lines["output"][0] == WORDS
    assert _charged_prompt(charge) == uncut.usage.input_tokens
    assert books.held(request_id) is None
    assert books.balance_nanos() == before - charge.total_nanos


def test_a_response_whose_prompt_and_max_output_tokens_fill_the_context_is_continued(
        fake_gateway, fakes, sdk, key, text, books):
    # the continuation's prompt holds the text kept: asked for the request's max_tokens on
    # top of it, the engine would refuse it (TOO_MANY_TOKENS) and the response would fail
    uncut = sdk.responses.create(model="chat-primary", input="Count", background=True,
                                 max_output_tokens=WORDS)
    for _ in sdk.responses.retrieve(uncut.id, stream=True):
        pass
    prompt = sdk.responses.retrieve(uncut.id).usage.input_tokens
    for engine in text.engines.values():
        engine.context = prompt + WORDS
    cut = FirstCallCut(text, after=3)
    request_id = "bg-full-context"
    created = sdk.responses.create(model="chat-primary", input="Count", background=True,
                                   max_output_tokens=WORDS,
                                   extra_headers={"X-Request-ID": request_id})
    assert cut.reached.wait(WAIT_S)
    _wait_for(lambda: _text_kept(fake_gateway, created.id) == "one two three ")
    dead = _dies(fake_gateway, created.id)

    with _replica(fake_gateway, fakes) as other:
        other.client.portal.call(other.services.responses.sweep)
        client = sdk_of(other, key)
        whole = list(client.responses.retrieve(created.id, stream=True))
        done = client.responses.retrieve(created.id)
    _bury(fake_gateway, created.id, dead)

    assert done.status == "completed", done.error
    assert done.output_text == REPLY
    assert [e.sequence_number for e in whole] == list(range(len(whole)))
    assert done.usage.input_tokens == prompt and done.usage.output_tokens == WORDS
    charge = books.only_charge(request_id)  # once, for all that was made
    assert charge.lines["output"][0] == WORDS and _charged_prompt(charge) == prompt
    assert books.held(request_id) is None


def test_a_replica_shutting_down_hands_its_responses_over_and_another_continues_them(
        fake_gateway, fakes, sdk, key, text, books):
    cut = FirstCallCut(text, after=3)
    before = books.balance_nanos()
    created, request_id = _create(sdk)
    assert cut.reached.wait(WAIT_S)
    _wait_for(lambda: _text_kept(fake_gateway, created.id) == "one two three ")
    k = _last_seq(fake_gateway, created.id)

    fake_gateway.client.portal.call(fake_gateway.services.responses.stop)

    assert cut.closed.is_set()  # its engine was stopped
    assert books.held(request_id) is not None  # its hold left for the replica that takes it
    assert books.charges(request_id) == []
    with _replica(fake_gateway, fakes) as other:
        client = sdk_of(other, key)
        assert client.responses.retrieve(created.id).status == "in_progress"
        other.client.portal.call(other.services.responses.sweep)  # its lease was given up
        resumed = list(client.responses.retrieve(created.id, stream=True, starting_after=k))
        done = client.responses.retrieve(created.id)

    assert [e.sequence_number for e in resumed] == list(range(k + 1, k + 1 + len(resumed)))
    assert resumed[-1].type == "response.completed"
    assert done.status == "completed" and done.output_text == REPLY
    assert len(cut.requests) == 2  # the first, and its continuation
    charge = books.only_charge(request_id)  # once, for all that was made
    assert charge.lines["output"][0] == WORDS
    assert books.held(request_id) is None
    assert books.balance_nanos() == before - charge.total_nanos


def test_a_response_whose_replica_died_before_its_first_event_is_run_whole_by_another(
        fake_gateway, fakes, sdk, key, text, books):
    cut = FirstCallCut(text, after=0)  # the engine sends nothing: no event is kept
    created, request_id = _create(sdk)
    assert cut.reached.wait(WAIT_S)
    dead = _dies(fake_gateway, created.id)

    with _replica(fake_gateway, fakes) as other:
        other.client.portal.call(other.services.responses.sweep)
        events = list(sdk_of(other, key).responses.retrieve(created.id, stream=True))
    _bury(fake_gateway, created.id, dead)

    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1].type == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == REPLY
    assert cut.requests[1].messages == cut.requests[0].messages  # the request itself
    assert books.only_charge(request_id).lines["output"][0] == WORDS


def test_of_two_replicas_sweeping_at_once_one_continues_it(fake_gateway, fakes, sdk, key,
                                                           text, books):
    cut = FirstCallCut(text, after=3)
    created, request_id = _create(sdk)
    assert cut.reached.wait(WAIT_S)
    _wait_for(lambda: _text_kept(fake_gateway, created.id) == "one two three ")
    dead = _dies(fake_gateway, created.id)

    with _replica(fake_gateway, fakes) as one, _replica(fake_gateway, fakes) as two:
        start = threading.Barrier(2)

        def sweep(replica) -> None:
            start.wait(WAIT_S)
            replica.client.portal.call(replica.services.responses.sweep)
        sweepers = [threading.Thread(target=sweep, args=(r,)) for r in (one, two)]
        for sweeper in sweepers:
            sweeper.start()
        for sweeper in sweepers:
            sweeper.join(WAIT_S)
        events = list(sdk_of(one, key).responses.retrieve(created.id, stream=True))
    _bury(fake_gateway, created.id, dead)

    assert len(cut.requests) == 2  # the first, and one continuation
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == REPLY
    assert books.only_charge(request_id).lines["output"][0] == WORDS
    assert books.held(request_id) is None


def test_a_response_whose_cancel_was_asked_is_not_continued_and_charges_what_it_made(
        fake_gateway, fakes, sdk, key, text, books):
    cut = FirstCallCut(text, after=3)
    created, request_id = _create(sdk)
    assert cut.reached.wait(WAIT_S)
    _wait_for(lambda: _text_kept(fake_gateway, created.id) == "one two three ")
    k = _last_seq(fake_gateway, created.id)
    fake_gateway.client.portal.call(fake_gateway.services.responses.store.request_cancel,
                                    created.id)  # asked; its replica died before it read it
    dead = _dies(fake_gateway, created.id)

    with _replica(fake_gateway, fakes) as other:
        other.client.portal.call(other.services.responses.sweep)
        client = sdk_of(other, key)
        after = list(client.responses.retrieve(created.id, stream=True, starting_after=k))
        done = client.responses.retrieve(created.id)
    _bury(fake_gateway, created.id, dead)

    assert [e for e in after if e.type == "response.output_text.delta"] == []
    assert done.status == "cancelled"
    assert done.output[0].content[0].text == "one two three "
    assert cut.requests[1].sampling.max_tokens == 1  # only counted what was made
    assert books.only_charge(request_id).lines["output"][0] == 3
    assert books.held(request_id) is None


def test_a_response_whose_hold_is_gone_is_failed_and_charged_nothing(
        fake_gateway, fakes, sdk, key, text, books):
    cut = FirstCallCut(text, after=3)
    before = books.balance_nanos()
    created, request_id = _create(sdk)
    assert cut.reached.wait(WAIT_S)
    _wait_for(lambda: _text_kept(fake_gateway, created.id) == "one two three ")
    dead = _dies(fake_gateway, created.id)
    billing = fake_gateway.services.billing
    assert fake_gateway.client.portal.call(
        billing.writer.run, lambda s: ledger.release(s, request_id)) is not None

    with _replica(fake_gateway, fakes) as other:
        other.client.portal.call(other.services.responses.sweep)
        client = sdk_of(other, key)
        events = list(client.responses.retrieve(created.id, stream=True))
        failed = client.responses.retrieve(created.id)
    _bury(fake_gateway, created.id, dead)

    assert len(cut.requests) == 1  # never continued
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.failed"
    assert failed.status == "failed" and failed.error.code == "INFERENCE_FAILED"
    assert books.charges(request_id) == [] and books.balance_nanos() == before


def test_a_live_worker_whose_response_was_taken_over_appends_nothing_and_charges_once(
        fake_gateway, fakes, key, text, books):
    _live_worker_taken_over(fake_gateway, fakes, key, text, books)


def test_with_redis_a_live_worker_whose_response_was_taken_over_appends_nothing(
        redis_gateway, fakes, text):
    """The events in Redis: the log's writer is claimed there, and the former one refused."""
    books = Books(redis_gateway)
    try:
        _live_worker_taken_over(redis_gateway, fakes, redis_gateway.create_key()["apiKey"], text,
                                books)
    finally:
        books.close()


def _live_worker_taken_over(gateway, fakes, key: str, text: FakeTextDeployment,
                            books: Books) -> None:
    sdk = sdk_of(gateway, key)
    cut = FirstCallCut(text, after=3, until=threading.Event())
    created, request_id = _create(sdk)
    assert cut.reached.wait(WAIT_S)
    _wait_for(lambda: _text_kept(gateway, created.id) == "one two three ")
    drive = gateway.services.responses._drives[created.id]
    _lease_runs_out(gateway, created.id)  # its renewal is late: taken for dead

    with _replica(gateway, fakes) as other:
        other.client.portal.call(other.services.responses.sweep)
        events = list(sdk_of(other, key).responses.retrieve(created.id, stream=True))
        cut.until.set()  # the first worker goes on, unaware until its next append
        gateway.client.portal.call(asyncio.wait, [drive.task])
        _wait_for(lambda: gateway.services.responses.drives._leaving == set())

    again = list(sdk.responses.retrieve(created.id, stream=True))
    assert [e.model_dump() for e in again] == [e.model_dump() for e in events]  # nothing since
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == REPLY
    assert cut.closed.is_set()  # its engine was stopped
    assert books.only_charge(request_id).lines["output"][0] == WORDS
    assert books.held(request_id) is None


def _row(gateway, response_id: str) -> StoredResponse:
    with Session(make_engine(gateway.settings.resolved_database_url)) as session:
        return session.get(StoredResponse, response_id)


def test_what_a_response_keeps_to_be_continued_is_noted_and_dropped_at_its_end(
        fake_gateway, sdk, text):
    cut = FirstCallCut(text, after=3, until=threading.Event())
    created = sdk.responses.create(model="chat-primary", input="Count", background=True)
    assert cut.reached.wait(WAIT_S)
    _wait_for(lambda: _text_kept(fake_gateway, created.id) == "one two three ")

    row = _row(fake_gateway, created.id)
    kept = json.loads(row.continuation)
    assert kept["request"]["messages"][-1] == {"role": "user", "content": "Count"}
    assert kept["model"] == "chat-primary"
    assert row.stored_bytes >= len(row.continuation)  # counted in the account's bound
    cut.until.set()
    for _ in sdk.responses.retrieve(created.id, stream=True):
        pass
    done = sdk.responses.retrieve(created.id)
    assert kept["prompt_tokens"] == done.usage.input_tokens  # noted before the first text
    assert _row(fake_gateway, created.id).continuation is None  # ended: not kept


def test_a_response_with_an_output_schema_keeps_nothing_to_be_continued(
        fake_gateway, sdk, text):
    cut = FirstCallCut(text, after=3, until=threading.Event())
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    created = sdk.responses.create(model="chat-primary", input="Count", background=True,
                                   text={"format": {"type": "json_schema", "name": "n",
                                                    "schema": schema}})
    try:
        assert cut.reached.wait(WAIT_S)
        _wait_for(lambda: _text_kept(fake_gateway, created.id) == "one two three ")
        row = _row(fake_gateway, created.id)
        assert row.status == "in_progress" and row.continuation is None
    finally:
        cut.until.set()
