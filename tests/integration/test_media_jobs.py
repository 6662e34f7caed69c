"""Queued video and audio through the real Serve application: every quote rule with its
figure, jobs from queue to a file that decodes (PyAV) or is heard back (Whisper), retrieval
and deletion, the restart of a platform that left a job half done, concurrent jobs charged
once each, and every refusal a clear error that charges nothing."""

from __future__ import annotations

import base64
import io
import time
import uuid
from datetime import timedelta

import av
import httpx
import numpy as np
import pytest
from PIL import Image
from sqlmodel import Session, col, select

from deployments.engines.video import encode_mp4
from serve_app.billing import ledger
from serve_app.db.engine import make_engine
from serve_app.db.tables import JobRow, LedgerEntry, utcnow
from tests.fakes.faces import drawn_face_png
from tests.integration.accounts import Account, nanos

pytestmark = pytest.mark.integration


@pytest.fixture
def account(platform, tmp_path) -> Account:
    return Account(platform, tmp_path)


def _clip(seconds: float, size: tuple[int, int] = (128, 96), fps: int = 8) -> bytes:
    """An MP4 of a white square crossing a dark background."""
    w, h = size
    frames = []
    for i in range(round(seconds * fps)):
        frame = np.full((h, w, 3), 30, np.uint8)
        x = int(i * (w - 24) / max(1, seconds * fps - 1))
        frame[h // 3: h // 3 + 24, x: x + 24] = 240
        frames.append(frame)
    return encode_mp4(frames, fps)


def _data_url(data: bytes, media_type: str) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def _png(size: tuple[int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (200, 80, 40)).save(out, "PNG")
    return out.getvalue()


def _frames(mp4: bytes) -> tuple[int, tuple[int, int]]:
    with av.open(io.BytesIO(mp4)) as container:
        frames = [f for f in container.decode(video=0)]
    return len(frames), (frames[0].width, frames[0].height)


def _wait(account: Account, kind: str, model: str, queue_id: str,
          timeout_s: float = 240) -> httpx.Response:
    """Poll retrieve until the job is no longer processing."""
    deadline = time.monotonic() + timeout_s
    while True:
        resp = account.post(f"/{kind}/retrieve", json={"model": model, "queue_id": queue_id})
        if not (resp.status_code == 200 and resp.headers["content-type"].startswith(
                "application/json") and resp.json().get("status") == "PROCESSING"):
            return resp
        body = resp.json()
        assert body["execution_duration"] >= 0 and body["average_execution_time"] > 0
        assert time.monotonic() < deadline, f"{kind} job {queue_id} still processing"
        time.sleep(0.5)


# ---- quotes ------------------------------------------------------------------------------

def test_video_quotes_follow_each_models_table(account, platform):
    upscale_src = _data_url(_clip(3.0, (640, 360), fps=30), "video/mp4")
    interp_src = _data_url(_clip(3.0, (320, 240), fps=24), "video/mp4")
    cases = [
        # per second by resolution: 0.02 x 3 s at 360p
        ({"model": "wan-text-to-video-test", "duration": "3s", "resolution": "360p"}, "0.06"),
        # per megapixel-second: 848x480 = 0.40704 MP x 0.2 x 4 s
        ({"model": "wan-image-to-video-test", "duration": "4s", "aspect_ratio": "16:9",
          "resolution": "480p"}, "0.325632"),
        # with reference videos: (5 s in + 5 s out, auto) x 448x256 (adaptive: the widest)
        ({"model": "wan-reference-to-video-test", "duration": "auto",
          "aspect_ratio": "adaptive", "reference_video_total_duration": 5}, "0.114688"),
        # no reference: the baseline rate for the output only (256x256 x 0.2 x 2 s)
        ({"model": "wan-reference-to-video-test", "duration": "2s", "aspect_ratio": "1:1"},
         "0.0262144"),
        # the output tier of 360 x 4 = 1440 is 2160p (0.08/s), doubled at 60 fps, over 3 s
        ({"model": "video-upscaler", "duration": "auto", "upscale_factor": 4,
          "target_fps": 60, "video_url": upscale_src}, "0.48"),
        # 360 x 2 = 720p (0.02/s), the model's default factor, at the source rate
        ({"model": "video-upscaler", "duration": "-1", "video_url": upscale_src}, "0.06"),
        # interpolation: linear in target_fps (48/24), slowdown 4 multiplies 2 s
        ({"model": "video-interpolator", "duration": "2s", "slowdown_factor": 4,
          "target_fps": 48, "enhancement_model": "dis-medium", "video_url": interp_src},
         "0.128"),
        # audio on by default, priced per second beside the video; off when asked
        ({"model": "video-with-audio-test", "duration": "10s"}, "0.6"),
        ({"model": "video-with-audio-test", "duration": "10s", "audio": False}, "0.5"),
    ]
    for body, quote in cases:
        resp = account.post("/video/quote", json=body)
        assert resp.status_code == 200, (body["model"], resp.text)
        assert nanos(resp.json()["quote"]) == nanos(quote), (body, resp.json())
    assert account.spent() == 0


def test_video_quote_refusals_name_the_rule(account):
    src = _data_url(_clip(3.0, (1920, 1080), fps=8), "video/mp4")
    cases = [
        ({"model": "wan-text-to-video-test", "duration": "8s", "resolution": "256p"}, 422,
         "VIDEO_DURATION_TOO_LONG"),
        ({"model": "wan-text-to-video-test", "duration": "2s"}, 400, "resolution is required"),
        ({"model": "wan-text-to-video-test", "duration": "2s", "resolution": "1080p"}, 400,
         "resolution"),
        ({"model": "wan-text-to-video-test", "duration": "7 s"}, 400, "duration"),
        ({"model": "wan-text-to-video-test", "duration": "auto", "resolution": "256p"}, 400,
         "source-matched"),
        ({"model": "wan-image-to-video-test", "duration": "2s"}, 400,
         "aspect_ratio is required"),
        ({"model": "wan-reference-to-video-test", "duration": "auto", "aspect_ratio": "1:1"},
         400, "reference_video_total_duration"),
        ({"model": "wan-reference-to-video-test", "duration": "auto", "aspect_ratio": "1:1",
          "reference_video_total_duration": 3}, 422, "VIDEO_DURATION_TOO_SHORT"),
        ({"model": "wan-reference-to-video-test", "duration": "2s", "aspect_ratio": "1:1",
          "reference_video_total_duration": 151}, 400, "reference_video_total_duration"),
        ({"model": "wan-text-to-video-test", "duration": "2s", "resolution": "256p",
          "slowdown_factor": 2}, 400, "frame interpolation"),
        ({"model": "video-interpolator", "duration": "2s", "video_url": src,
          "enhancement_model": "rife"}, 400, "dis-fast"),
        ({"model": "video-upscaler", "duration": "auto", "upscale_factor": 4,
          "video_url": src}, 400, "upscale_factor"),
        ({"model": "video-upscaler", "duration": "auto"}, 400, "video_url"),
        ({"model": "video-upscaler", "duration": "auto",
          "video_url": _data_url(b"not a video", "video/mp4")}, 400, "INVALID_VIDEO_FORMAT"),
        ({"model": "video-upscaler", "duration": "auto",
          "video_url": "http://169.254.169.254/latest/clip.mp4"}, 400, "not reachable"),
        ({"model": "video-upscaler", "duration": "auto", "target_fps": 200,
          "video_url": src}, 400, "target_fps"),
        ({"model": "tiny-chat", "duration": "2s"}, 400, "INVALID_MODEL"),
        ({"model": "no-such-video", "duration": "2s"}, 404, "MODEL_NOT_FOUND"),
    ]
    for body, status, words in cases:
        resp = account.post("/video/quote", json=body)
        assert resp.status_code == status, (body, resp.text)
        assert words.lower() in resp.text.lower(), (body, resp.text)
        assert "error" in resp.json()
    anonymous = httpx.post(f"{account.url}/video/quote",
                           json={"model": "wan-text-to-video-test", "duration": "2s"})
    assert anonymous.status_code in (401, 402), anonymous.text  # 402: x402 discovery


def test_audio_quotes_by_characters_duration_and_generation(account):
    cases = [
        ({"model": "piper-narrator", "character_count": 2000}, "0.03"),
        ({"model": "music-tiers-test", "duration_seconds": 90}, "0.05"),
        ({"model": "music-tiers-test", "duration_seconds": "75"}, "0.05"),
        ({"model": "music-tiers-test"}, "0.03"),  # the model's default duration
        ({"model": "sound-effects-test", "duration_seconds": 12.5}, "0.025"),
        ({"model": "jingle-test"}, "0.04"),
    ]
    for body, quote in cases:
        resp = account.post("/audio/quote", json=body)
        assert resp.status_code == 200, (body, resp.text)
        assert nanos(resp.json()["quote"]) == nanos(quote), (body, resp.json())
    for seconds, usd in ((30, "0.03"), (61, "0.05")):  # whole minutes, rounded up
        resp = account.post("/audio/voice-changer/quote",
                            json={"model": "voice-changer", "duration_seconds": seconds})
        assert resp.status_code == 200 and nanos(resp.json()["quote"]) == nanos(usd)
        assert resp.json()["duration_seconds"] == seconds

    refusals = [
        ("/audio/quote", {"model": "piper-narrator"}, "character_count is required"),
        ("/audio/quote", {"model": "piper-narrator", "character_count": 0}, "character_count"),
        ("/audio/quote", {"model": "music-tiers-test", "duration_seconds": 500}, "10 to 120"),
        ("/audio/quote", {"model": "sound-effects-test", "duration_seconds": "-3"},
         "duration_seconds"),
        ("/audio/quote", {"model": "sound-effects-test", "duration_seconds": "ten"},
         "duration_seconds"),
        ("/audio/quote", {"model": "jingle-test", "duration_seconds": 30}, "takes no duration"),
        ("/audio/quote", {"model": "voice-changer", "duration_seconds": 30},
         "/audio/voice-changer/quote"),
        ("/audio/voice-changer/quote", {"model": "piper-narrator", "duration_seconds": 30},
         "/audio/quote"),
        ("/audio/voice-changer/quote", {"model": "voice-changer"}, "duration_seconds"),
        ("/audio/quote", {"model": "tts-piper-joe"}, "INVALID_MODEL"),
    ]
    for path, body, words in refusals:
        resp = account.post(path, json=body)
        assert resp.status_code == 400, (path, body, resp.text)
        assert words.lower() in resp.text.lower(), (body, resp.text)
    assert account.spent() == 0


# ---- video jobs --------------------------------------------------------------------------

def test_text_to_video_from_quote_to_mp4_charged_the_quote(account):
    body = {"model": "wan-text-to-video-test", "prompt": "a lighthouse at dusk",
            "duration": "1s", "resolution": "256p", "aspect_ratio": "16:9"}
    quote = account.post("/video/quote", json=body).json()["quote"]
    assert nanos(quote) == nanos("0.01")
    resp = account.post("/video/queue", json=body)
    assert resp.status_code == 200, resp.text
    queued = resp.json()
    assert queued["model"] == "wan-text-to-video-test"
    uuid.UUID(queued["queue_id"])
    # The price is held while the job waits or runs, and charged once it is made.
    assert account.spent() == nanos(quote)

    resp = _wait(account, "video", queued["model"], queued["queue_id"])
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "video/mp4"
    frames, size = _frames(resp.content)
    assert (frames, size) == (9, (448, 256))  # 1 s at 8 fps as 4k + 1 frames, 16:9 at 256p
    assert account.spent() == nanos(quote)
    assert account.skus() == ["wan-text-to-video-test-video-video-seconds-unit"]

    again = account.post("/video/retrieve", json={"model": queued["model"],
                                                  "queue_id": queued["queue_id"]})
    assert again.content == resp.content
    by_query = httpx.get(f"{account.url}/video/retrieve", headers=account.auth,
                         params={"model": queued["model"], "queue_id": queued["queue_id"]})
    assert by_query.status_code == 200 and by_query.content == resp.content
    # retrieve streams this model's video, so its queue result names no delivery link, and a
    # client that takes JSON only is told the job is COMPLETED
    assert "download_url" not in queued
    status = httpx.post(f"{account.url}/video/retrieve", timeout=60,
                        headers={**account.auth, "Accept": "application/json"},
                        json={"model": queued["model"], "queue_id": queued["queue_id"]})
    assert status.status_code == 200 and status.json()["status"] == "COMPLETED"
    done = account.post("/video/complete", json={"model": queued["model"],
                                                 "queue_id": queued["queue_id"]})
    assert done.status_code == 200 and done.json() == {"success": True}
    gone = account.post("/video/retrieve", json={"model": queued["model"],
                                                 "queue_id": queued["queue_id"]})
    assert gone.status_code == 404 and gone.json()["code"] == "MEDIA_NOT_FOUND"
    assert account.spent() == nanos(quote)


def test_image_to_video_needs_consent_only_for_a_face(account, platform):
    """Faces are looked for in the picture: a plain one is animated without consent, one that
    shows a face needs `consents.seedance` (the published name; `face-media` an alias)."""
    body = {"model": "wan-image-to-video-test", "prompt": "she turns her head",
            "duration": "1s", "aspect_ratio": "1:1", "resolution": "256p"}
    plain = account.post("/video/queue", json={
        **body, "image_url": platform.web.publish("sky.png", _png((320, 240)), "image/png")})
    assert plain.status_code == 200, plain.text

    face_url = platform.web.publish("portrait.png", drawn_face_png((320, 240)), "image/png")
    resp = account.post("/video/queue", json={**body, "image_url": face_url})
    assert resp.status_code == 409, resp.text
    needs = resp.json()
    assert needs["error"]["code"] == "needs_consent"
    assert needs["consent_flow"] == "seedance" and needs["face_media_roles"] == ["image"]
    assert needs["consent"]["consent_version"] and needs["consent"]["policy_text"]

    consent = {"confirmed_terms_and_privacy": True, "confirmed_legal_right": True,
               "confirmed_screening_acknowledged": True}
    resp = account.post("/video/queue", json={**body, "image_url": face_url,
                                              "consents": {"seedance": consent}})
    assert resp.status_code == 200, resp.text
    for queue_id in (plain.json()["queue_id"], resp.json()["queue_id"]):
        video = _wait(account, "video", body["model"], queue_id)
        assert video.status_code == 200 and _frames(video.content) == (9, (256, 256))
    assert account.spent() == 2 * nanos("0.0131072")  # 256x256 = 0.065536 MP x 0.2 x 1 s


def test_reference_and_enhancement_jobs_make_their_clips(account):
    reference = _data_url(_clip(2.0, (160, 120)), "video/mp4")
    jobs = [
        # follows a 2 s reference for 1 s: (2 + 1) s x 256x256 x 0.1
        ({"model": "wan-reference-to-video-test", "prompt": "the square, in watercolour",
          "duration": "1s", "aspect_ratio": "1:1", "reference_video_urls": [reference]},
         (9, (256, 256)), "0.0196608"),
        # every frame x2: 160x120 -> 320x240, 2 s at 8 fps; 240p is priced as 480p
        ({"model": "video-upscaler", "prompt": "sharper", "duration": "auto",
          "video_url": reference}, (16, (320, 240)), "0.02"),
        # twice as slow at 16 fps: 2 s -> 4 s, 64 frames
        ({"model": "video-interpolator", "prompt": "smoother", "duration": "auto",
          "slowdown_factor": 2, "target_fps": 16, "video_url": reference},
         (64, (160, 120)), "0.010666667"),
    ]
    queued = []
    for body, _, quote in jobs:
        asked = {k: v for k, v in body.items() if k != "reference_video_urls"}
        if "reference_video_urls" in body:  # quoted by the references' length
            asked["reference_video_total_duration"] = 2
        assert nanos(account.post("/video/quote", json=asked).json()["quote"]) == nanos(quote)
        resp = account.post("/video/queue", json=body)
        assert resp.status_code == 200, (body["model"], resp.text)
        queued.append(resp.json()["queue_id"])
    for (body, shape, _), queue_id in zip(jobs, queued, strict=True):
        resp = _wait(account, "video", body["model"], queue_id)
        assert resp.status_code == 200, (body["model"], resp.text)
        assert _frames(resp.content) == shape, body["model"]
    assert account.spent() == sum(nanos(q) for _, _, q in jobs)


def test_video_queue_refusals_are_clear_and_charge_nothing(account, platform):
    big = "A" * (34 * 1024 * 1024)  # 25.5 MB once decoded
    cases = [
        ({"model": "wan-text-to-video-test", "duration": "1s", "resolution": "256p"}, 400,
         "prompt"),
        ({"model": "wan-text-to-video-test", "prompt": "x" * 2501, "duration": "1s",
          "resolution": "256p"}, 400, "at most 2500"),
        ({"model": "wan-text-to-video-test", "prompt": "a scene full of gore",
          "duration": "1s", "resolution": "256p"}, 422, "suggested_prompt"),
        ({"model": "wan-text-to-video-test", "prompt": "a cat", "duration": "1s",
          "resolution": "256p", "image_url": "https://example.com/a.png"}, 400,
         "does not use image_url"),
        ({"model": "wan-image-to-video-test", "prompt": "a cat", "duration": "1s",
          "aspect_ratio": "1:1"}, 400, "image_url is required"),
        ({"model": "wan-image-to-video-test", "prompt": "a cat", "duration": "1s",
          "aspect_ratio": "1:1", "image_url": "http://10.0.0.5/cat.png",
          "consents": {"face-media": {"confirmed_terms_and_privacy": True,
                                      "confirmed_legal_right": True,
                                      "confirmed_screening_acknowledged": True}}},
         400, "not reachable"),
        ({"model": "video-upscaler", "prompt": "x", "duration": "auto",
          "video_url": f"data:video/mp4;base64,{big}"}, 413, "PAYLOAD_TOO_LARGE"),
        ({"model": "wan-reference-to-video-test", "prompt": "x", "duration": "1s",
          "aspect_ratio": "1:1",
          "reference_video_urls": [_data_url(_clip(16.0, (64, 48), fps=2), "video/mp4")]},
         400, "1 to 15 s"),
        ({"model": "video-upscaler", "prompt": "x", "duration": "5s",
          "video_url": _data_url(_clip(2.0), "video/mp4")}, 400, "longer than the source"),
        ({"model": "video-with-audio-test", "prompt": "x", "duration": "5s"}, 503,
         "MODEL_OFFLINE"),
    ]
    for body, status, words in cases:
        resp = account.post("/video/queue", json=body)
        assert resp.status_code == status, (body["model"], resp.text[:300])
        assert words.lower() in resp.text.lower(), resp.text[:300]
    refused = account.post("/video/queue", json=cases[2][0]).json()
    assert refused["code"] == "CONTENT_POLICY_VIOLATION"
    assert refused["suggested_prompt"] == "a scene full of"
    unknown = account.post("/video/retrieve", json={"model": "wan-text-to-video-test",
                                                    "queue_id": str(uuid.uuid4())})
    assert unknown.status_code == 404 and unknown.json()["code"] == "MEDIA_NOT_FOUND"
    assert account.spent() == 0


def test_jobs_belong_to_their_account(account, platform, tmp_path):
    body = {"model": "wan-text-to-video-test", "prompt": "rain", "duration": "1s",
            "resolution": "256p", "aspect_ratio": "1:1"}
    queue_id = account.post("/video/queue", json=body).json()["queue_id"]
    (tmp_path / "other").mkdir()
    other = Account(platform, tmp_path / "other")
    for path in ("/video/retrieve", "/video/complete"):
        resp = other.post(path, json={"model": body["model"], "queue_id": queue_id})
        assert resp.status_code == 404, resp.text
    assert _wait(account, "video", body["model"], queue_id).status_code == 200
    wrong_model = account.post("/video/retrieve", json={"model": "video-upscaler",
                                                        "queue_id": queue_id})
    assert wrong_model.status_code == 400 and "wan-text-to-video-test" in wrong_model.text


def test_concurrent_jobs_are_each_charged_once(account, platform):
    body = {"model": "wan-text-to-video-test", "prompt": "waves", "duration": "1s",
            "resolution": "256p", "aspect_ratio": "1:1"}
    # Alternate the Gateway replicas: each runs a job worker over the same job table.
    ids = []
    for i in range(4):
        url = platform.replica_urls[i % len(platform.replica_urls)]
        resp = httpx.post(f"{url}/video/queue", json=body, headers=account.auth, timeout=60)
        assert resp.status_code == 200, resp.text
        ids.append(resp.json()["queue_id"])
    for queue_id in ids:
        assert _wait(account, "video", body["model"], queue_id).status_code == 200
    assert account.spent() == 4 * nanos("0.01")
    engine = make_engine(platform.sqlite_url)
    with Session(engine) as session:
        jobs = [session.get(JobRow, queue_id) for queue_id in ids]
        entries = session.exec(select(LedgerEntry.request_id).where(
            col(LedgerEntry.request_id).in_([j.request_id for j in jobs]))).all()
    engine.dispose()
    assert all(job.status == "COMPLETED" for job in jobs)
    assert len(entries) == 4


def test_a_job_left_running_by_a_stopped_platform_is_finished_or_released(account, platform):
    """What a restarted platform finds: jobs a runner of its previous life had claimed, their
    leases run out. One with a try left is made and charged once; one that used its tries is
    failed and its hold released."""
    engine = make_engine(platform.sqlite_url, write_transactions=True)
    now = utcnow()
    jobs = {}
    for name, attempts in (("retry", 1), ("worn", 2)):
        job = JobRow(kind="video", model_id="wan-text-to-video-test",
                       request_id=f"restart-{name}-{uuid.uuid4().hex[:8]}",
                       account_id=account.account_id, api_key_id=None, status="PROCESSING",
                       params={"prompt": "left behind", "seconds": 1.0, "width": 256,
                               "height": 256, "fps": 8.0, "seed": 0},
                       cost_lines=[["video_seconds", 1, 10_000_000, 0.01]],
                       attempts=attempts, lease_owner="old-host:1:gone",
                       lease_expires_at=now - timedelta(seconds=5),
                       created_at=now - timedelta(minutes=2))
        jobs[name] = job.queue_id
        with Session(engine) as session:
            ledger.hold(session, job.request_id, ledger.Payer(account.account_id),
                        10_000_000, now)
            session.add(job)
            session.commit()
    engine.dispose()
    assert account.spent() == 2 * nanos("0.01")  # both holds, as the old platform left them

    made = _wait(account, "video", "wan-text-to-video-test", jobs["retry"])
    assert made.status_code == 200 and _frames(made.content) == (9, (256, 256))
    failed = _wait(account, "video", "wan-text-to-video-test", jobs["worn"], timeout_s=60)
    assert failed.status_code == 500 and failed.json()["code"] == "INFERENCE_FAILED"
    assert "nothing was charged" in failed.json()["error"]
    assert account.spent() == nanos("0.01")  # the finished one, once; the other released


# ---- audio jobs --------------------------------------------------------------------------

def test_audio_job_speech_is_heard_back_by_whisper(account):
    text = "The quick brown fox jumps over the lazy dog."
    quote = account.post("/audio/quote", json={"model": "piper-narrator",
                                               "character_count": len(text)}).json()["quote"]
    resp = account.post("/audio/queue", json={"model": "piper-narrator", "prompt": text,
                                              "voice": "joe"})
    assert resp.status_code == 200, resp.text
    queued = resp.json()
    assert queued["status"] == "QUEUED" and queued["model"] == "piper-narrator"
    audio = _wait(account, "audio", "piper-narrator", queued["queue_id"])
    assert audio.status_code == 200, audio.text
    assert audio.headers["content-type"] == "audio/mpeg"
    assert account.spent() == nanos(quote) == nanos("0.00066")  # 44 characters
    heard = account.post("/audio/transcriptions", data={"model": "whisper-base"},
                         files={"file": ("speech.mp3", audio.content, "audio/mpeg")})
    assert heard.status_code == 200, heard.text
    words = heard.json()["text"].lower()
    # Piper's voice varies from one synthesis to the next (its model draws noise), and
    # Whisper-base may mishear a word or two of it ("the quit brown fox", "the quip round fox"
    # were heard): three of the five, the majority, make the sentence, which no noise does.
    heard_words = [w for w in ("quick", "brown", "fox", "lazy", "dog") if w in words]
    assert len(heard_words) >= 3, words
    assert account.post("/audio/retrieve", json={
        "model": "piper-narrator", "queue_id": queued["queue_id"],
        "delete_media_on_completion": True}).status_code == 200
    gone = account.post("/audio/retrieve", json={"model": "piper-narrator",
                                                 "queue_id": queued["queue_id"]})
    assert gone.status_code == 404 and gone.json()["code"] == "MEDIA_NOT_FOUND"
    assert "piper-narrator-music-queued-characters-kchar" in account.skus()


def test_audio_queue_refusals_charge_nothing(account):
    cases = [
        ({"model": "piper-narrator"}, 400, "prompt"),
        ({"model": "piper-narrator", "prompt": "   "}, 400, "prompt"),
        ({"model": "piper-narrator", "prompt": "hi", "voice": "nobody"}, 400, "joe"),
        ({"model": "piper-narrator", "prompt": "hi", "loop": True}, 400, "loop"),
        ({"model": "piper-narrator", "prompt": "hi", "speed": 9}, 400, "speed"),
        ({"model": "voice-changer", "prompt": "hi"}, 400, "voice-changer"),
        # The request's own checks come before the offline check (serve_app/pipeline/bill.py):
        # a model without voices is refused for that before its being offline is looked at.
        ({"model": "jingle-test", "prompt": "hi"}, 400, "offers no voices"),
    ]
    for body, status, words in cases:
        resp = account.post("/audio/queue", json=body)
        assert resp.status_code == status, (body, resp.text)
        assert words.lower() in resp.text.lower(), resp.text
    assert account.spent() == 0


# ---- voice changes -----------------------------------------------------------------------

def _tone_wav(seconds: float, rate: int = 16_000) -> bytes:
    """A quiet hum with no words in it (Whisper hears nothing; digital silence it may not)."""
    pcm = (np.sin(np.arange(round(seconds * rate)) / 5) * 800).astype("<i2").tobytes()
    return (b"RIFF" + (36 + len(pcm)).to_bytes(4, "little") + b"WAVE" + b"fmt "
            + (16).to_bytes(4, "little") + (1).to_bytes(2, "little") + (1).to_bytes(2, "little")
            + rate.to_bytes(4, "little") + (2 * rate).to_bytes(4, "little")
            + (2).to_bytes(2, "little") + (16).to_bytes(2, "little")
            + b"data" + len(pcm).to_bytes(4, "little") + pcm)


def test_voice_change_speaks_the_words_in_the_target_voice_for_a_whole_minute(account):
    text = "The quick brown fox jumps over the lazy dog."
    spoken = account.post("/audio/speech", json={"input": text, "model": "tts-piper-joe",
                                                 "response_format": "wav"})
    assert spoken.status_code == 200, spoken.text
    before = account.spent()
    started = time.monotonic()
    resp = account.post("/audio/voice-changer/queue", data={"model": "voice-changer",
                                                            "voice": "joe"},
                        files={"file": ("words.wav", spoken.content, "audio/wav")})
    assert resp.status_code == 200, resp.text
    queued = resp.json()
    assert queued["status"] == "QUEUED" and queued["model"] == "voice-changer"
    assert 1.0 < queued["duration_seconds"] < 10.0
    audio = _wait(account, "audio/voice-changer", "voice-changer", queued["queue_id"])
    elapsed = time.monotonic() - started

    assert audio.status_code == 200, audio.text
    assert audio.headers["content-type"] == "audio/mpeg"
    assert audio.headers["x-service-audio-format"] == "mp3"
    with av.open(io.BytesIO(audio.content)) as container:  # an MP3 of the voice's speech
        assert container.format.name == "mp3"
        samples = sum(f.samples for f in container.decode(audio=0))
        rate = container.streams.audio[0].sample_rate
    assert samples / rate > 1.0
    assert account.spent() - before == nanos("0.03")  # one whole minute, exactly
    assert "voice-changer-music-audio-minutes-unit" in account.skus()
    heard = account.post("/audio/transcriptions", data={"model": "whisper-base"},
                         files={"file": ("changed.mp3", audio.content, "audio/mpeg")})
    words = heard.json()["text"].lower()
    # heard twice by Whisper-base and spoken once more: most of the words make it through
    assert len([w for w in ("quick", "brown", "fox", "lazy", "dog") if w in words]) >= 3, words
    print(f"voice change of {queued['duration_seconds']} s made in {elapsed:.1f} s")
    done = account.post("/audio/voice-changer/complete",
                        json={"model": "voice-changer", "queue_id": queued["queue_id"]})
    assert done.status_code == 200 and done.json() == {"success": True}


def test_voice_change_too_long_charges_nothing_and_without_words_its_hearing(account):
    too_long = account.post("/audio/voice-changer/queue", data={"model": "voice-changer"},
                            files={"file": ("long.wav", _tone_wav(121), "audio/wav")})
    assert too_long.status_code == 422, too_long.text
    assert too_long.json()["code"] == "AUDIO_DURATION_TOO_LONG"
    assert account.spent() == 0

    hum = account.post("/audio/voice-changer/queue", data={"model": "voice-changer"},
                       files={"file": ("hum.wav", _tone_wav(3), "audio/wav")})
    assert hum.status_code == 200, hum.text
    failed = _wait(account, "audio/voice-changer", "voice-changer", hum.json()["queue_id"])
    assert failed.status_code == 422, failed.text
    assert failed.json()["code"] == "NO_SPEECH_HEARD"
    assert failed.json()["credits_refunded"] is False  # decoded and heard in full: charged
    assert account.spent() == nanos("0.03")  # its one minute
