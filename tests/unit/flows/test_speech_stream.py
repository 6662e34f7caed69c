"""Speech through admission, the speech deployment and settlement, in process: what is
delivered is charged. A streamed answer read to its end pays for the whole input; a client that
leaves before the last piece pays for the characters of the pieces it was sent (nothing sent:
nothing charged), and so does a stream that breaks on our side (a whole answer that breaks is
not charged). The client is an ASGI server's view of one: it reads pieces, then goes away the
two ways servers report it (a write that fails, ASGI 2.4; or `http.disconnect` while a write
waits, before 2.4)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import pytest

from serve_app.metrics import metrics
from tests.fakes import FakeSpeechDeployment, crashed
from tests.unit.flows.asgi import LeavingClient, post_scope
from tests.unit.flows.books import per_million

INPUT_USD = 10  # speaker (speech_catalog.yaml), USD per million characters
TEXT = "The first sentence is short. The second one is a little longer. And a third ends it."
SERVER_SPECS = ["2.4", "2.3"]


@pytest.fixture
def gateway_catalog() -> Path:
    return Path(__file__).with_name("speech_catalog.yaml")


@pytest.fixture
def fakes() -> dict[str, FakeSpeechDeployment]:
    return {"speech": FakeSpeechDeployment("speech", ["speaker"],
                                           voices=["narrator", "whisperer"])}


def _speak(gateway, key: str, body: dict[str, Any], *,
           leave_after: int | Literal["start"] | None = None,
           spec: str = "2.4") -> tuple[int, dict[str, str], list[bytes]]:
    """POST /api/v1/audio/speech into the gateway's ASGI app on its own loop, as a server
    would. The client reads `leave_after` pieces of audio and goes away (None: it reads all).
    Answers the status, the headers and the pieces it read."""
    payload = json.dumps(body).encode()
    scope = post_scope("/api/v1/audio/speech", payload, gateway.auth(key), spec=spec)
    client = LeavingClient(payload, leave_after=leave_after, spec=spec)
    gateway.client.portal.call(client.call, gateway.client.app, scope)
    return client.status, client.headers, client.pieces


def test_a_streamed_speech_read_to_the_end_pays_for_the_whole_input(fake_gateway, key, books):
    before = books.balance_nanos()

    status, headers, pieces = _speak(fake_gateway, key, {"input": TEXT, "streaming": True})

    assert status == 200
    expected = FakeSpeechDeployment.pieces_for(TEXT)
    assert pieces == [p.audio for p in expected] and len(pieces) == 3
    charge = books.only_charge(headers["cf-ray"])
    assert charge.lines == {"speech_characters": (len(TEXT), per_million(INPUT_USD, len(TEXT)))}
    assert books.balance_nanos() == before - charge.total_nanos
    assert books.open_holds() == 0


@pytest.mark.parametrize("spec", SERVER_SPECS)
def test_a_client_leaving_after_the_first_piece_pays_for_its_characters(fake_gateway, key,
                                                                         books, spec):
    """The attack: read the first sentence of a long text, hang up, repeat. Before, it was
    free (the hold was released); now the characters sent are charged, nothing more."""
    before = books.balance_nanos()

    status, headers, pieces = _speak(fake_gateway, key, {"input": TEXT, "streaming": True},
                                     leave_after=1, spec=spec)

    assert status == 200
    first = FakeSpeechDeployment.pieces_for(TEXT)[0]
    assert pieces == [first.audio]
    charge = books.only_charge(headers["cf-ray"])
    assert charge.lines == {"speech_characters": (first.characters,
                                                  per_million(INPUT_USD, first.characters))}
    assert 0 < first.characters < len(TEXT)
    assert books.balance_nanos() == before - charge.total_nanos
    assert books.held(headers["cf-ray"]) is None and books.open_holds() == 0


@pytest.mark.parametrize("leave", [0, "start"], ids=["before-the-start", "after-the-start"])
@pytest.mark.parametrize("spec", SERVER_SPECS)
def test_a_client_gone_before_any_audio_pays_nothing(fake_gateway, key, books, spec, leave):
    """...and its synthesis is stopped: no call to the speech deployment stays open."""
    before, calls = books.balance_nanos(), metrics().calls_in_flight("speech")

    status, headers, pieces = _speak(fake_gateway, key, {"input": TEXT, "streaming": True},
                                     leave_after=leave, spec=spec)

    assert metrics().calls_in_flight("speech") == calls

    assert status == 200 and pieces == []
    assert books.charges(headers["cf-ray"]) == []
    assert books.balance_nanos() == before and books.open_holds() == 0


def test_a_stream_that_breaks_charges_the_pieces_it_delivered(fake_gateway, fakes, key, books):
    """The model breaks after one piece (before, the hold was released and the piece free):
    the characters of the piece sent are charged, nothing more."""
    fakes["speech"].fail_with(crashed(), after_pieces=2)  # the start and one piece, then breaks
    before = books.balance_nanos()

    status, headers, pieces = _speak(fake_gateway, key, {"input": TEXT, "streaming": True})

    assert status == 200 and len(pieces) == 1
    first = FakeSpeechDeployment.pieces_for(TEXT)[0]
    charge = books.only_charge(headers["cf-ray"])
    assert charge.lines == {"speech_characters": (first.characters,
                                                  per_million(INPUT_USD, first.characters))}
    assert books.balance_nanos() == before - charge.total_nanos and books.open_holds() == 0


def test_a_whole_answer_the_model_breaks_off_is_not_charged(fake_gateway, fakes, key, books):
    """Unstreamed, nothing of a broken answer is delivered: nothing is charged."""
    fakes["speech"].fail_with(crashed(), after_pieces=2)
    before = books.balance_nanos()

    resp = fake_gateway.client.post("/api/v1/audio/speech", headers=fake_gateway.auth(key),
                                    json={"input": TEXT})

    assert resp.status_code == 500, resp.text
    assert books.charges(resp.headers["cf-ray"]) == []
    assert books.balance_nanos() == before and books.open_holds() == 0


def test_a_whole_speech_answer_pays_for_the_whole_input(fake_gateway, key, books):
    before = books.balance_nanos()

    resp = fake_gateway.client.post("/api/v1/audio/speech", headers=fake_gateway.auth(key),
                                    json={"input": TEXT})

    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "audio/pcm"
    assert resp.content == b"".join(p.audio for p in FakeSpeechDeployment.pieces_for(TEXT))
    charge = books.only_charge(resp.headers["cf-ray"])
    assert charge.lines["speech_characters"][0] == len(TEXT)
    assert books.balance_nanos() == before - charge.total_nanos
