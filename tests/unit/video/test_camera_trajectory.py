"""`camera_trajectory` on `/video/queue`, checked as the reference checks it: 2 to 12 keyframes
of `{time, azimuth, elevation, distance}`, times strictly increasing within [0, 1], elevation
-90 to 90, distance positive, the azimuth travelling at most 32 turns, and an `image_url` to
move around. A bad one is a 400 detailed error naming the field, with nothing held, charged,
fetched or queued; a good one is queued."""

from __future__ import annotations

import pytest

from tests.unit.video.api import post, stored
from tests.unit.video.clips import png

BODY = {"model": "face-animator", "prompt": "the camera circles", "duration": "1s",
        "aspect_ratio": "1:1"}


def _keyframes(*times: float, azimuth: float = 0, elevation: float = 0,
               distance: float = 1) -> list[dict]:
    return [{"time": t, "azimuth": azimuth * i, "elevation": elevation, "distance": distance}
            for i, t in enumerate(times)]


BAD_PATHS = {
    "one keyframe": _keyframes(0),
    "thirteen keyframes": _keyframes(*[i / 12 for i in range(13)]),
    "an empty path": [],
    "a time going back": _keyframes(0, 0.6, 0.5),
    "a time repeated": _keyframes(0, 0.5, 0.5, 1),
    "a time past 1": _keyframes(0, 1.5),
    "a negative time": _keyframes(-0.1, 0.5),
    "elevation past 90": _keyframes(0, 1, elevation=91),
    "distance 0": _keyframes(0, 1, distance=0),
    "negative distance": _keyframes(0, 1, distance=-1),
    "more than 32 turns": _keyframes(0, 0.5, 1, azimuth=32 * 180 + 1),
    "a keyframe without azimuth": [{"time": 0, "elevation": 0, "distance": 1},
                                   {"time": 1, "azimuth": 0, "elevation": 0, "distance": 1}],
    "a keyframe that is not an object": [0, 1],
    "text for a time": [*_keyframes(0, 1), {"time": "later", "azimuth": 0, "elevation": 0,
                                            "distance": 1}],
}


@pytest.mark.parametrize("path", list(BAD_PATHS.values()), ids=list(BAD_PATHS))
def test_a_bad_camera_path_is_a_400_and_nothing_is_held_or_fetched(gateway, fakes, media,
                                                                   key, books, path):
    picture = media.publish("sky.png", png((320, 320), (135, 206, 235)), "image/png")
    before = books.balance_nanos()

    resp = post(gateway, key, "queue", {**BODY, "image_url": picture,
                                        "camera_trajectory": path})

    assert resp.status_code == 400, resp.text
    body = resp.json()
    assert body["code"] == "INVALID_REQUEST" and isinstance(body["error"], str)
    assert "camera_trajectory" in body["details"]
    assert books.held(resp.headers["cf-ray"]) is None
    assert books.balance_nanos() == before
    assert media.requests == [] and stored(gateway) == []
    assert fakes["video-generation"].calls == []


def test_a_camera_path_needs_an_image(gateway, fakes, key, books):
    before = books.balance_nanos()

    resp = post(gateway, key, "queue", {**BODY, "camera_trajectory": _keyframes(0, 1)})

    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] == "INVALID_REQUEST"
    assert "camera_trajectory" in resp.json()["details"]["image_url"]["_errors"][0]
    assert fakes["video-generation"].calls == []
    assert books.balance_nanos() == before


def test_a_good_camera_path_is_queued(gateway, media, key):
    picture = media.publish("sky.png", png((320, 320), (135, 206, 235)), "image/png")
    path = _keyframes(0, 0.25, 0.5, 0.75, 1, azimuth=90, elevation=-30, distance=1.5)

    resp = post(gateway, key, "queue", {**BODY, "image_url": picture,
                                        "camera_trajectory": path})

    assert resp.status_code == 200, resp.text
    assert set(resp.json()) == {"model", "queue_id"}
