"""Queued audio goes through the same intake as video: held before it is queued, counted in
the account's open jobs (one cap across video and audio), and its media deleted like a
video's."""

from __future__ import annotations

import time

import pytest

from tests.unit.flows.books import nanos
from tests.unit.video.api import post, stored, stored_when

SPEECH = {"model": "narrator", "prompt": "The quick brown fox jumps over the lazy dog.",
          "voice": "joe"}
SPEECH_USD = "0.00066"  # 44 characters at 0.015 USD per thousand
TEXT = {"model": "clip-maker", "prompt": "rain on a window", "duration": "1s",
        "resolution": "256p", "aspect_ratio": "1:1"}


def _audio(gateway, key: str, path: str, body: dict):
    return gateway.client.post(f"/api/v1/audio/{path}", headers=gateway.auth(key), json=body)


def _wait_audio(gateway, key: str, queue_id: str, timeout_s: float = 120):
    deadline = time.monotonic() + timeout_s
    while True:
        resp = _audio(gateway, key, "retrieve", {"model": "narrator", "queue_id": queue_id})
        if not (resp.headers["content-type"].startswith("application/json")
                and resp.status_code == 200 and resp.json().get("status") == "PROCESSING"):
            return resp
        assert time.monotonic() < deadline, "the audio job was not made in time"
        time.sleep(0.05)


@pytest.mark.parametrize("gateway_settings", [{"job_open_per_account": 1}], indirect=True)
def test_queued_audio_counts_toward_the_same_open_jobs_cap_as_video(gateway, fakes, key,
                                                                    books):
    fakes["speech"].pause()
    queued = _audio(gateway, key, "queue", SPEECH)
    assert queued.status_code == 200, queued.text
    assert books.held(queued.headers["cf-ray"]) == nanos(SPEECH_USD)

    for refused in (_audio(gateway, key, "queue", SPEECH), post(gateway, key, "queue", TEXT)):
        assert refused.status_code == 429, refused.text
        assert refused.json()["code"] == "RATE_LIMIT_EXCEEDED"
        assert books.held(refused.headers["cf-ray"]) is None
    fakes["speech"].resume()
    made = _wait_audio(gateway, key, queued.json()["queue_id"])
    assert made.status_code == 200 and made.headers["content-type"] == "audio/mpeg"
    assert books.only_charge(queued.headers["cf-ray"]).total_nanos == nanos(SPEECH_USD)
    assert stored(gateway) == ["result"]
    done = _audio(gateway, key, "complete", {"model": "narrator",
                                             "queue_id": queued.json()["queue_id"]})
    assert done.status_code == 200 and done.json() == {"success": True}
    assert stored_when(gateway, []) == []
