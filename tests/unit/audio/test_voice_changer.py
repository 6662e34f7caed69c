"""The voice changer as a client sees it: the source (an upload or a URL) heard, then spoken in
the voice asked; billed by whole minutes of the source measured by the server; every refusal
before a charge (400s, 422 too long, 402), a failed job refunded and saying so, and a retried
request with its Idempotency-Key answered once."""

from __future__ import annotations

import pytest

from serve_app.audio.sources import sniff
from tests.unit.audio.conftest import asked, encoded, mp4_clip, wav
from tests.unit.audio.voice_api import (
    call,
    job_rows,
    ledger_entry,
    queue_file,
    queue_json,
    wait,
)
from tests.unit.conftest import account_key
from tests.unit.flows.books import nanos
from tests.unit.video.api import stored, stored_when


def test_an_upload_is_heard_then_spoken_and_charged_its_whole_minutes(gateway, key, books,
                                                                      fakes):
    source = wav(61.5)
    queued = queue_file(gateway, key, source)

    assert queued.status_code == 200, queued.text
    body = queued.json()
    assert body == {"model": "changer", "queue_id": body["queue_id"], "status": "QUEUED",
                    "duration_seconds": 61.5}
    assert books.held(queued.headers["cf-ray"]) in (None, nanos("0.05"))  # 2 minutes
    made = wait(gateway, key, body["queue_id"])

    assert made.status_code == 200, made.text
    assert made.headers["content-type"] == "audio/mpeg"
    assert sniff(made.content) == "mp3"
    assert made.headers["x-service-audio-format"] == "mp3"
    assert made.headers["x-service-model-id"] == "changer"
    assert made.headers["x-service-model-name"] == "Voice changer (fake models)"
    assert int(made.headers["x-service-inference-time"]) >= 0
    assert fakes["transcription"].heard == [source]
    assert asked(fakes["speech"]) == [{"prompt": "Hello there, how are you?", "voice": "joe",
                                       "format": "mp3", "speed": 1.0}]
    charge = books.only_charge(queued.headers["cf-ray"])
    assert charge.total_nanos == nanos("0.05")
    assert charge.lines == {"audio_minutes": (2, nanos("0.05"))}
    entry = ledger_entry(gateway, queued.headers["cf-ray"])
    assert entry is not None and entry.unit_type == "minutes" and entry.units == {
        "audio_minutes": 2}
    assert stored_when(gateway, ["result"]) == ["result"]  # the source went once it served
    for _ in range(2):  # safe to call twice
        done = call(gateway, key, "voice-changer/complete",
                    {"model": "changer", "queue_id": body["queue_id"]})
        assert done.status_code == 200 and done.json() == {"success": True}
    assert stored(gateway) == []


def test_an_audio_url_is_fetched_and_its_bytes_decide_the_format(gateway, key, books, media,
                                                                 fakes):
    url = media.publish("talk.txt", encoded(20, "opus"), "text/plain")  # an Ogg file
    queued = queue_json(gateway, key, {"model": "changer", "audio_url": url, "voice": "AMY"})

    assert queued.status_code == 200, queued.text
    assert 19.9 <= queued.json()["duration_seconds"] <= 20.1
    assert wait(gateway, key, queued.json()["queue_id"]).status_code == 200
    assert asked(fakes["speech"])[0]["voice"] == "amy"
    assert books.only_charge(queued.headers["cf-ray"]).total_nanos == nanos("0.03")
    job = job_rows(gateway)[0]
    assert job.params["source_format"] == "ogg" and job.kind == "voice-change"


def test_a_file_is_judged_by_its_bytes_not_its_name_or_type(gateway, key, books):
    named_mp3 = queue_file(gateway, key, wav(3), filename="song.mp3",
                           content_type="audio/mpeg")
    assert named_mp3.status_code == 200, named_mp3.text
    refusals = [
        (b"this is not audio at all, only words" * 10, "song.wav", "audio/wav"),
        (encoded(3, "flac"), "voice.flac", "audio/flac"),  # a format the model does not take
        (mp4_clip(), "clip.mp3", "audio/mpeg"),  # a video, whatever its name
    ]
    before = books.balance_nanos()
    for data, name, content_type in refusals:
        resp = queue_file(gateway, key, data, filename=name, content_type=content_type)
        assert resp.status_code == 400, resp.text
        assert resp.json()["code"] == "INVALID_AUDIO_FORMAT"
        assert "mp3, wav, ogg" in resp.json()["error"]
        assert books.held(resp.headers["cf-ray"]) is None
    assert books.balance_nanos() == before
    assert len(job_rows(gateway)) == 1


def test_a_wav_that_cannot_be_measured_is_refused(gateway, key, books):
    header_only = wav(2)[:44]
    resp = queue_file(gateway, key, header_only)

    assert resp.status_code == 400, resp.text
    assert "length" in resp.json()["error"] or "read" in resp.json()["error"]
    assert books.open_holds() == 0 and books.entries() == 0


@pytest.mark.parametrize(("fields", "words"), [
    ({}, "source audio is required"),
    ({"audio_url": "ftp://example.com/a.wav"}, "http or https"),
    ({"audio_url": "https://example.com/a.wav", "speed": 2}, "unrecognized key"),
    ({"audio_url": "https://example.com/a.wav", "seed": -1}, "seed"),
    ({"audio_url": "https://example.com/a.wav", "seed": 7}, "does not support seed"),
    ({"audio_url": "https://example.com/a.wav", "remove_background_noise": True},
     "does not support remove_background_noise"),
    ({"audio_url": "https://example.com/a.wav", "voice": "nobody"}, "joe, amy"),
    ({"audio_url": "https://example.com/a.wav", "voice": "x" * 61}, "voice"),
    ({"audio_url": "https://example.com/a.wav", "model": "narrator"},
     "/audio/queue"),
    ({"audio_url": "https://example.com/a.wav", "callback_url": "http://10.0.0.1/hook"},
     "callback_url"),
])
def test_json_field_refusals_are_400s_before_anything_is_held(gateway, key, books, fields,
                                                              words):
    resp = queue_json(gateway, key, {"model": "changer", **fields})

    assert resp.status_code == 400, resp.text
    assert words.lower() in resp.text.lower(), resp.text
    assert books.held(resp.headers["cf-ray"]) is None
    assert books.open_holds() == 0 and books.entries() == 0 and job_rows(gateway) == []


@pytest.mark.parametrize(("fields", "words"), [
    ({"audio_url": "https://example.com/a.wav"}, "not both"),
    ({"seed": "abc"}, "seed"),
    ({"remove_background_noise": "true"}, "remove_background_noise"),
    ({"colour": "blue"}, "unrecognized key"),
])
def test_multipart_field_refusals_are_400s_before_anything_is_held(gateway, key, books,
                                                                   fields, words):
    resp = queue_file(gateway, key, wav(2), **fields)

    assert resp.status_code == 400, resp.text
    assert words.lower() in resp.text.lower(), resp.text
    assert books.open_holds() == 0 and books.entries() == 0 and job_rows(gateway) == []


def test_multipart_false_and_json_false_options_are_accepted(gateway, key):
    resp = queue_file(gateway, key, wav(2), remove_background_noise="false")
    assert resp.status_code == 200, resp.text


def test_a_source_too_long_is_a_422_with_no_hold_no_charge_and_nothing_kept(gateway, key,
                                                                           books, media):
    before = books.balance_nanos()
    uploaded = queue_file(gateway, key, wav(121))
    fetched = queue_json(gateway, key, {"model": "changer",
                                        "audio_url": media.publish("long.wav", wav(125),
                                                                   "audio/wav")})

    for resp in (uploaded, fetched):
        assert resp.status_code == 422, resp.text
        assert resp.json()["code"] == "AUDIO_DURATION_TOO_LONG"
        assert "at most 120 s" in resp.json()["error"]
        assert books.held(resp.headers["cf-ray"]) is None
    assert books.open_holds() == 0 and books.entries() == 0
    assert books.balance_nanos() == before
    assert job_rows(gateway) == [] and stored(gateway) == []


def test_402_for_the_first_minute_before_the_url_is_fetched_and_for_the_measured_price(
        gateway, books, media):
    poor, _ = account_key(gateway, "0.01")
    url = media.publish("talk.wav", wav(30), "audio/wav")
    refused = queue_json(gateway, poor, {"model": "changer", "audio_url": url})

    assert refused.status_code == 402, refused.text
    assert refused.json()["code"] == "INSUFFICIENT_BALANCE"
    assert media.requests == []  # nothing fetched for a caller who cannot pay a minute

    some, account = account_key(gateway, "0.04")  # pays one minute, not two
    assert queue_file(gateway, some, wav(90)).status_code == 402
    assert books.balance_nanos(account) == nanos("0.04")
    one = queue_file(gateway, some, wav(30))
    assert one.status_code == 200, one.text
    assert books.open_holds() <= 1 and books.entries() <= 1
    assert len(job_rows(gateway)) == 1


def test_a_source_with_no_speech_is_charged_for_its_hearing_and_says_so(gateway, key, books,
                                                                         fakes):
    fakes["transcription"].said = "   "  # silence: nothing to say in another voice
    before = books.balance_nanos()
    silent = queue_file(gateway, key, wav(5))
    assert silent.status_code == 200, silent.text
    first = wait(gateway, key, silent.json()["queue_id"])

    assert first.status_code == 422, first.text
    assert first.json()["code"] == "NO_SPEECH_HEARD"
    assert first.json()["credits_refunded"] is False
    assert "charged" in first.json()["error"]
    again = call(gateway, key, "voice-changer/retrieve",
                 {"model": "changer", "queue_id": silent.json()["queue_id"]})
    assert (again.status_code, again.json()) == (first.status_code, first.json())
    assert books.only_charge(silent.headers["cf-ray"]).total_nanos == nanos("0.03")
    assert books.open_holds() == 0 and books.balance_nanos() == before - nanos("0.03")
    assert asked(fakes["speech"]) == []  # nothing was spoken
    assert stored_when(gateway, []) == []


def test_a_failed_job_is_refunded_and_says_so_on_every_poll_without_internal_text(
        gateway, key, books, fakes):
    from tests.fakes import crashed

    before = books.balance_nanos()
    fakes["speech"].fail_with(crashed())
    broken = queue_file(gateway, key, wav(5))
    failed = wait(gateway, key, broken.json()["queue_id"])
    assert failed.status_code == 500, failed.text
    assert failed.json()["credits_refunded"] is True
    assert failed.json()["error"] == "The generation failed; nothing was charged"
    again = call(gateway, key, "voice-changer/retrieve",
                 {"model": "changer", "queue_id": broken.json()["queue_id"]})
    assert (again.status_code, again.json()) == (failed.status_code, failed.json())
    assert books.charges(broken.headers["cf-ray"]) == []
    assert books.open_holds() == 0 and books.balance_nanos() == before
    assert stored_when(gateway, []) == []


def test_a_retry_with_its_idempotency_key_is_answered_once(gateway, key, books):
    source = wav(10)
    headers = {"Idempotency-Key": "change-1"}
    first = queue_file(gateway, key, source, headers=headers)
    again = queue_file(gateway, key, source, headers=headers)
    other = queue_file(gateway, key, wav(11), headers=headers)

    assert first.status_code == again.status_code == 200, (first.text, again.text)
    assert again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    assert other.status_code == 409 and other.json()["code"] == "IDEMPOTENCY_KEY_REUSED"
    assert len(job_rows(gateway)) == 1
    assert wait(gateway, key, first.json()["queue_id"]).status_code == 200
    assert books.only_charge(first.headers["cf-ray"]).total_nanos == nanos("0.03")


def test_a_running_job_answers_its_status_and_timing(gateway, key, fakes):
    fakes["transcription"].pause()
    try:
        queued = queue_file(gateway, key, wav(3))
        status = call(gateway, key, "voice-changer/retrieve",
                      {"model": "changer", "queue_id": queued.json()["queue_id"]})
    finally:
        fakes["transcription"].resume()
    assert status.status_code == 200, status.text
    body = status.json()
    assert body["status"] == "PROCESSING"
    assert isinstance(body["average_execution_time"], int)
    assert isinstance(body["execution_duration"], int) and body["execution_duration"] >= 0
    assert wait(gateway, key, queued.json()["queue_id"]).status_code == 200


def test_each_endpoint_refuses_the_other_kind_of_model(gateway, key, books):
    speech = call(gateway, key, "queue", {"model": "narrator", "prompt": "Hello."})
    speech_id = speech.json()["queue_id"]
    cases = [
        ("voice-changer/quote", {"model": "narrator", "duration_seconds": 5}, "/audio/quote"),
        ("voice-changer/retrieve", {"model": "narrator", "queue_id": speech_id},
         "/audio/retrieve"),
        ("voice-changer/complete", {"model": "narrator", "queue_id": speech_id},
         "/audio/complete"),
        ("quote", {"model": "changer", "duration_seconds": 5}, "/audio/voice-changer/quote"),
        ("queue", {"model": "changer", "prompt": "hi"}, "/audio/voice-changer/queue"),
        ("retrieve", {"model": "changer", "queue_id": speech_id},
         "/audio/voice-changer/retrieve"),
        ("complete", {"model": "changer", "queue_id": speech_id},
         "/audio/voice-changer/complete"),
    ]
    for path, body, words in cases:
        resp = call(gateway, key, path, body)
        assert resp.status_code == 400, (path, resp.text)
        assert words in resp.json()["error"], (path, resp.text)


def test_an_unknown_or_foreign_queue_id_is_answered_as_audio_retrieve_answers_it(gateway,
                                                                                 key):
    speech_id = call(gateway, key, "queue", {"model": "narrator", "prompt": "Hi."}
                     ).json()["queue_id"]
    changed_id = queue_file(gateway, key, wav(2)).json()["queue_id"]
    other, _ = account_key(gateway, "1")
    for queue_id, caller in (("no-such-job", key), (speech_id, key), (changed_id, other)):
        mine = call(gateway, caller, "voice-changer/retrieve",
                    {"model": "changer", "queue_id": queue_id})
        theirs = call(gateway, caller, "retrieve", {"model": "narrator", "queue_id": queue_id})
        assert mine.status_code == 404, mine.text
        assert mine.json()["code"] == "MEDIA_NOT_FOUND"
        if queue_id != speech_id:  # that one is the caller's own audio job there
            assert theirs.status_code == 404


def test_the_quote_is_the_price_of_the_whole_minutes(gateway, key):
    cases = [(30, "0.03"), (60, "0.03"), ("61", "0.05"), (120, "0.05")]
    for seconds, usd in cases:
        resp = call(gateway, key, "voice-changer/quote",
                    {"model": "changer", "duration_seconds": seconds})
        assert resp.status_code == 200, resp.text
        assert nanos(resp.json()["quote"]) == nanos(usd)
        assert resp.json()["duration_seconds"] == float(seconds)
    too_long = call(gateway, key, "voice-changer/quote",
                    {"model": "changer", "duration_seconds": 121})
    assert too_long.status_code == 422 and too_long.json()["code"] == "AUDIO_DURATION_TOO_LONG"
    missing = call(gateway, key, "voice-changer/quote", {"model": "changer"})
    assert missing.status_code == 400 and "duration_seconds" in missing.text


def test_the_model_record_says_what_the_voice_changer_takes(gateway):
    listed = gateway.client.get("/api/v1/models", params={"type": "music"}).json()["data"]
    spec = next(m for m in listed if m["id"] == "changer")["model_spec"]

    assert spec["offline"] is False
    assert spec["voice_changer"] is True
    assert spec["accepted_audio_formats"] == ["mp3", "wav", "ogg"]
    assert spec["max_source_audio_duration_seconds"] == 120
    assert spec["supports_background_noise_removal"] is False
    assert spec["supports_seed"] is False
    assert spec["supports_custom_voice_id"] is False
    assert spec["voices"] == ["joe", "amy"] and spec["default_voice"] == "joe"
    assert spec["pricing"]["durations"]["2"]["usd"] == 0.05


def test_a_voice_changer_whose_speech_deployment_is_down_is_offline_and_holds_nothing(
        tmp_path, fakes):
    from serve_app.settings import Settings
    from tests.unit.audio.conftest import CATALOG
    from tests.unit.conftest import make_gateway

    for gateway in make_gateway(Settings(data_dir=tmp_path, initial_credit_usd=10,
                                         model_catalog=CATALOG),
                                handles={"transcription": fakes["transcription"]}):
        record = gateway.client.get("/api/v1/models/changer").json()
        assert record["model_spec"]["offline"] is True
        resp = queue_file(gateway, gateway.admin_key, wav(3))
        assert resp.status_code == 503, resp.text
        assert resp.json()["code"] == "MODEL_OFFLINE" and "'speech'" in resp.json()["error"]
        assert fakes["transcription"].heard == [] and job_rows(gateway) == []
