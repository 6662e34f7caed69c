"""A voice change's source is billed for all the audio an engine would decode (issue 48,
attack 2): a chained Ogg file (complete Ogg streams back to back, each restarting at zero) was
measured by its first chain while Whisper decoded every one, 30 chains of 59 s billed one
minute for 29.5 of Whisper. Now it is refused before anything is held; files joined end to end
in another format are measured part by part; the job runs at the engines as the caller's
tenant and tells the engine its format and the seconds it was billed for."""

from __future__ import annotations

import time

import pytest

from deployments.protocol import PLATFORM_TENANT, Tenant
from serve_app.audio.sources import measure
from serve_app.audio.voice_pipeline import DECODE_TOLERANCE_S
from tests.unit.audio.conftest import asked, encoded, wav
from tests.unit.audio.voice_api import job_rows, queue_file, wait
from tests.unit.conftest import account_key


@pytest.fixture(scope="module")
def chain() -> bytes:
    """One complete Ogg Opus stream of 59 s."""
    return encoded(59, "opus")


def test_thirty_chained_ogg_streams_are_refused_with_nothing_held(gateway, key, books,
                                                                   chain, fakes):
    before = books.balance_nanos()

    resp = queue_file(gateway, key, chain * 30, filename="talk.ogg",
                      content_type="audio/ogg")

    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] == "INVALID_AUDIO_FORMAT"
    assert "30 streams" in resp.json()["error"]
    assert books.balance_nanos() == before and books.open_holds() == 0
    assert books.charges(resp.headers["cf-ray"]) == []
    assert job_rows(gateway) == [] and fakes["transcription"].heard == []


def test_one_ogg_stream_is_still_taken(gateway, key, chain):
    resp = queue_file(gateway, key, chain, filename="talk.ogg", content_type="audio/ogg")

    assert resp.status_code == 200, resp.text
    assert 58.9 <= resp.json()["duration_seconds"] <= 59.1


def test_an_ogg_file_whose_pages_do_not_follow_one_another_is_refused(gateway, key, books,
                                                                      chain):
    hidden = chain + b"garbage a decoder would skip" + chain  # a second chain behind a gap

    resp = queue_file(gateway, key, hidden, filename="talk.ogg", content_type="audio/ogg")

    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] == "INVALID_AUDIO_FORMAT"
    assert books.open_holds() == 0 and job_rows(gateway) == []


def test_flac_files_joined_end_to_end_are_measured_part_by_part():
    part = encoded(20, "flac")  # each part's frames restart at sample zero

    seconds = measure(part * 5, "flac", "file", 600)

    assert seconds >= 5 * 20 - DECODE_TOLERANCE_S  # within what the engine lets pass
    assert seconds <= 5 * 20 + 0.5


def test_the_engine_is_told_the_format_and_the_seconds_billed(gateway, key, fakes):
    queued = queue_file(gateway, key, wav(42))
    assert queued.status_code == 200, queued.text

    assert wait(gateway, key, queued.json()["queue_id"]).status_code == 200

    engine = next(iter(fakes["transcription"].engines.values()))
    assert engine.bounds == [("wav", 42 + DECODE_TOLERANCE_S)]


def test_a_source_that_decodes_longer_than_billed_fails_with_nothing_charged(gateway, key,
                                                                            books, fakes):
    for engine in fakes["transcription"].engines.values():  # what a fooled measure lets by
        engine.hear = lambda audio: ("a long speech", 600.0)
    before = books.balance_nanos()
    queued = queue_file(gateway, key, wav(30))

    failed = wait(gateway, key, queued.json()["queue_id"])

    assert failed.status_code == 400, failed.text
    assert failed.json()["code"] == "INVALID_AUDIO_FORMAT"
    assert failed.json()["credits_refunded"] is True
    assert books.charges(queued.headers["cf-ray"]) == []
    assert books.open_holds() == 0 and books.balance_nanos() == before
    assert asked(fakes["speech"]) == []


def _interactive_tenant(gateway, key: str, fakes) -> Tenant:
    """The tenant the caller's own transcription request is served as."""
    resp = gateway.client.post("/api/v1/audio/transcriptions", headers=gateway.auth(key),
                               data={"model": "hearing"},
                               files={"file": ("a.wav", wav(1), "audio/wav")})
    assert resp.status_code == 200, resp.text
    tenant = fakes["transcription"].calls_to("transcribe")[-1].args[1].tenant
    assert tenant is not None and tenant != PLATFORM_TENANT
    return tenant


def test_a_voice_change_runs_at_the_engines_as_the_callers_tenant(gateway, key, fakes):
    caller = _interactive_tenant(gateway, key, fakes)
    queued = queue_file(gateway, key, wav(5))
    assert wait(gateway, key, queued.json()["queue_id"]).status_code == 200

    heard = fakes["transcription"].calls_to("transcribe")[-1].args[1]
    spoken = fakes["speech"].calls_to("synthesize")[0].args[1]
    assert heard.tenant == caller and spoken.tenant == caller
    other, _ = account_key(gateway, "5")
    assert _interactive_tenant(gateway, other, fakes) != caller


def test_a_queued_speech_job_runs_at_the_engine_as_the_callers_tenant(gateway, key, fakes):
    caller = _interactive_tenant(gateway, key, fakes)
    queued = gateway.client.post("/api/v1/audio/queue", headers=gateway.auth(key),
                                 json={"model": "narrator", "prompt": "Good evening.",
                                       "voice": "joe"})
    assert queued.status_code == 200, queued.text
    retrieve = {"model": "narrator", "queue_id": queued.json()["queue_id"]}
    deadline = time.monotonic() + 120
    while not fakes["speech"].calls_to("synthesize"):
        assert time.monotonic() < deadline, "the job was not made in time"
        time.sleep(0.05)
    assert gateway.client.post("/api/v1/audio/retrieve", headers=gateway.auth(key),
                               json=retrieve).status_code == 200

    assert fakes["speech"].calls_to("synthesize")[0].args[1].tenant == caller
