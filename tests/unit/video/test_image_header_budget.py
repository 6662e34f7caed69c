"""Image-to-video reads its picture's header as every image route does: in the shared
inspector's workers within a deadline, never on the event loop, and every picture it refuses
spends the account's budget of refused images (issue 35, item 8d)."""

from __future__ import annotations

from serve_app.limits.policy import REFUSED_IMAGES_MAX
from tests.unit.flows.test_image_header_refusals import MARKER_PADDED_JPEG, SMALL_PADDED_JPEG
from tests.unit.video.api import post, stored
from tests.unit.video.clips import data_url, png
from tests.unit.video.test_fetch_admission import CONSENT

BODY = {"model": "face-animator", "prompt": "the wind picks up", "duration": "1s",
        "aspect_ratio": "1:1", "consents": CONSENT}


def test_the_marker_padded_jpeg_is_a_400_with_nothing_held(gateway, fakes, key, books):
    before = books.balance_nanos()

    resp = post(gateway, key, "queue", {**BODY, "image_url": data_url(MARKER_PADDED_JPEG,
                                                                       "image/jpeg")})

    assert resp.status_code == 400, resp.text[:300]
    assert resp.json()["code"] == "CORRUPTED_IMAGE"
    assert books.open_holds() == 0 and books.entries() == 0
    assert books.balance_nanos() == before
    assert stored(gateway) == [] and fakes["video-generation"].calls == []


def test_refused_pictures_spend_the_accounts_budget_across_its_keys(gateway, fakes, books):
    """Past the budget the account's next picture is refused before its header is read, a
    good one too."""
    keys = [gateway.create_key()["apiKey"] for _ in range(3)]
    for n in range(REFUSED_IMAGES_MAX + 1):
        resp = post(gateway, keys[n % 2], "queue",
                    {**BODY, "image_url": data_url(SMALL_PADDED_JPEG, "image/jpeg")})
        assert resp.status_code == 400, (n, resp.text)

    resp = post(gateway, keys[2], "queue", {**BODY, "image_url": data_url(png(), "image/png")})

    assert resp.status_code == 429, resp.text
    assert "refused images" in resp.json()["error"]
    assert books.open_holds() == 0 and books.entries() == 0
    assert stored(gateway) == [] and fakes["video-generation"].calls == []
