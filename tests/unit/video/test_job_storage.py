"""Every stored byte expires, through the API: a job's inputs are deleted once it is made or
has failed, its media once a download link's lifetime has passed (retrieve then answers 404),
and an account past its cap on open jobs or stored bytes gets a 429 that holds,
charges and keeps nothing."""

from __future__ import annotations

import io
from datetime import timedelta

import numpy as np
import pytest
from PIL import Image
from sqlmodel import Session

from serve_app.db.engine import make_engine
from serve_app.db.tables import JobRow, utcnow
from serve_app.jobs.worker import RESULT_LIFETIME_S
from tests.fakes import crashed
from tests.unit.flows.books import nanos
from tests.unit.video.api import post, stored, stored_when, wait
from tests.unit.video.clips import clip, data_url, png

UPSCALE = {"model": "clip-upscaler", "prompt": "sharper", "duration": "auto"}
TEXT = {"model": "clip-maker", "prompt": "rain on a window", "duration": "1s",
        "resolution": "256p", "aspect_ratio": "1:1"}
TEXT_USD = "0.01"


def test_inputs_go_when_a_job_is_made_or_fails_and_media_when_its_link_expires(
        gateway, fakes, media, key, books):
    body = {**UPSCALE, "video_url": media.publish("clip.mp4", clip(2.0), "video/mp4")}
    queued = post(gateway, key, "queue", body)
    assert queued.status_code == 200, queued.text
    queue_id = queued.json()["queue_id"]
    made = wait(gateway, key, body["model"], queue_id)
    assert made.status_code == 200, made.text
    assert stored_when(gateway, ["result"]) == ["result"]  # the input went once it was made

    fakes["video-enhance"].fail_with(crashed())
    failing = post(gateway, key, "queue", body)
    assert failing.status_code == 200, failing.text
    failed = wait(gateway, key, body["model"], failing.json()["queue_id"])
    assert failed.status_code == 500
    assert stored_when(gateway, ["result"]) == ["result"]  # the failed job's input went too
    assert books.charges(failing.headers["cf-ray"]) == []

    engine = make_engine(gateway.settings.resolved_database_url)
    with Session(engine) as session:  # made a moment past its link's lifetime ago
        job = session.get(JobRow, queue_id)
        job.finished_at = utcnow() - timedelta(seconds=RESULT_LIFETIME_S + 1)
        session.add(job)
        session.commit()
    engine.dispose()
    gateway.client.portal.call(gateway.services.job_worker.sweep)

    gone = post(gateway, key, "retrieve", {"model": body["model"], "queue_id": queue_id})
    assert gone.status_code == 404 and gone.json()["code"] == "MEDIA_NOT_FOUND"
    assert stored(gateway) == []
    assert books.only_charge(queued.headers["cf-ray"]).total_nanos == nanos("0.02")


@pytest.mark.parametrize("gateway_settings", [{"job_open_per_account": 2}], indirect=True)
def test_an_account_past_its_open_jobs_cap_gets_429_and_nothing_is_held(gateway, fakes,
                                                                        key, books):
    fakes["video-generation"].pause()
    first = [post(gateway, key, "queue", TEXT) for _ in range(2)]
    assert [r.status_code for r in first] == [200, 200]
    before = books.balance_nanos()

    refused = post(gateway, key, "queue", TEXT)

    assert refused.status_code == 429, refused.text
    assert refused.json()["code"] == "RATE_LIMIT_EXCEEDED"
    assert "at most 2" in refused.json()["error"]
    assert books.held(refused.headers["cf-ray"]) is None
    assert books.balance_nanos() == before
    fakes["video-generation"].resume()
    for resp in first:
        assert wait(gateway, key, TEXT["model"], resp.json()["queue_id"]).status_code == 200
    again = post(gateway, key, "queue", TEXT)  # the jobs ended: room again
    assert again.status_code == 200, again.text
    assert wait(gateway, key, TEXT["model"], again.json()["queue_id"]).status_code == 200
    assert books.charges(refused.headers["cf-ray"]) == []


def _noise_png(side: int) -> bytes:
    """A picture that does not compress: about 3 x side^2 bytes as a PNG."""
    pixels = np.random.default_rng(7).integers(0, 256, (side, side, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


@pytest.mark.parametrize("gateway_settings", [{"job_stored_mb_per_account": 1}],
                         indirect=True)
def test_inputs_past_the_accounts_stored_bytes_cap_are_refused_and_not_kept(gateway, key,
                                                                           books):
    big = _noise_png(700)
    assert len(big) > 1024 * 1024
    before = books.balance_nanos()
    consent = {"seedance": {"confirmed_terms_and_privacy": True, "confirmed_legal_right": True,
                            "confirmed_screening_acknowledged": True}}
    body = {"model": "face-animator", "prompt": "a sky", "duration": "1s",
            "aspect_ratio": "1:1", "consents": consent}

    refused = post(gateway, key, "queue", {**body, "image_url": data_url(big, "image/png")})

    assert refused.status_code == 429, refused.text
    assert refused.json()["code"] == "RATE_LIMIT_EXCEEDED"
    assert "1.0 MB" in refused.json()["error"]
    assert stored(gateway) == []
    assert books.open_holds() == 0 and books.balance_nanos() == before
    small = post(gateway, key, "queue", {**body, "image_url": data_url(png(), "image/png")})
    assert small.status_code == 200, small.text
    assert wait(gateway, key, body["model"], small.json()["queue_id"]).status_code == 200

